"""SSBJ and MESHJOIN steps as DataFrame transforms (seeds/ssbj_semi_stream_balanced_join.txt).

One step of the operator is one ``groupBy(bucket).applyInArrow`` pass: the step's new stream
tuples, the operator's state (H_S, H_R, the counters, s_B), master partition ``step mod k``
of every version the step needs and, when the master moved, the rows that changed, are
laid out as one wide table (``joins.ssbj.buckets``), split by the join value's hash into
buckets as the step's key routing says (``joins.skew.key_routing``: one bucket per Spark task,
hot keys moved by GreedyFit), and each bucket runs Algorithm 1 (``joins.ssbj.algorithm``).
The result holds the enriched rows, the whole new state and each bucket's load, so the
stateful driver (``pipeline.ssbj``) writes two tables per step: the output and the
operator state. The state scales out with executors like a keyed operator: a bucket is one
group.

Also here: :func:`scan_rows`, the assignment of master rows to the k partitions of the
cyclic scan, the readers of the state table's roles, and the state table's segments.

**Segments**, so that a step rewrites what changed, not H_S. The state table (one row per
item of H_S, H_R, the counters and s_B) is partitioned by ``_segment``: a pending tuple of
H_S, its entry step (>= 0), its chunk of Algorithm 1's queue Q; H_R (role ``cache``) -1;
the counters -2; the values marked for s_B (``marked``) -3; the rows s_B collected
(``switch``) -5; the tuples waiting for late master rows -4. The marks are set at a
switching cycle's first step and the rows grow every step of it: apart, a step of that
cycle rewrites the rows, not the marks. A step replaces only the segments whose rows
changed, in one commit (:func:`changed_segments`), so its writes grow with its input and
with what the cache and counters did, not with H_S. :func:`state_of` (Spark) and
:func:`with_segments` (Arrow) compute the same column.

Every enriched row has the input's columns, then the master's projected columns, then the
master version column; unmatched rows of left joins carry nulls there, like the baseline.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import narwhals.stable.v2 as nw
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.rows import Frame, Rows, rows_where, with_timestamp_of_micros
from joins.columns import version_column
from joins.skew.greedyfit import KeyLoad
from joins.skew.key_routing import BucketLoad, task_labels
from joins.ssbj.bucket_encode import LATE_MIN_METRICS
from joins.ssbj.late import LATE_SINCE, WAITING_SINCE
from joins.ssbj.roles import (
    BUCKET,
    CACHE,
    COUNTER,
    EMPTY,
    ENTRY_STEP,
    KEY_HASH,
    KEY_LOAD,
    KEY_SKETCH,
    LATE,
    MARKED,
    MATCHED,
    METRIC,
    METRIC_ROLE,
    PENDING,
    PINNED_VERSION,
    PROBES,
    ROLE,
    SKETCH,
    STATE_ROLES,
    STORED,
    SWITCH,
    VALUE,
    master_field,
    stream_field,
)

INPUT_VERSION = "_input_version"
SCAN_PART = "_scan_part"
__all__ = ["ENTRY_STEP", "INPUT_VERSION", "PINNED_VERSION", "SCAN_PART", "JoinSpec"]


@dataclass(frozen=True)
class JoinSpec:
    """What an SSBJ stage joins: key columns on both sides, master projection, join type."""

    stream_keys: tuple[str, ...]
    master_keys: tuple[str, ...]
    master_columns: tuple[str, ...]
    master_name: str
    how: str

    @property
    def version(self) -> str:
        return version_column(self.master_name)


def scan_rows(master_rows: DataFrame, spec: JoinSpec, partitions: int) -> DataFrame:
    """Projected master rows with their scan partition ``hash(row) mod k`` (MESHJOIN's R_p).

    A hash of the whole row, not of the join key: partition sizes stay within a few percent
    of |R|/k for any key skew (a key's rows spread over partitions, as in MESHJOIN, where a
    pending tuple meets every partition anyway). Deterministic, so a rerun recomputes the
    same partitions.
    """
    columns = [F.col(c) for c in spec.master_columns]
    part = F.pmod(F.xxhash64(*columns), F.lit(partitions)).cast(T.IntegerType())
    return master_rows.select(*columns, part.alias(SCAN_PART))


_LOAD_COLUMNS = (BUCKET, KEY_HASH, STORED, PROBES, SKETCH)
_SUMMARY_COLUMNS = (ROLE, METRIC, VALUE, BUCKET, KEY_HASH, STORED, PROBES, SKETCH)


def state_of(result: DataFrame, segmented: bool = False) -> DataFrame:
    """The new operator state in a step's result (without the load columns); with
    ``segmented``, each row's ``_segment`` (the module docstring) after them."""
    state = result.where(F.col(ROLE).isin(*STATE_ROLES)).drop(*_LOAD_COLUMNS)
    if not segmented:
        return state
    segment = F.when(F.col(ROLE) == F.lit(PENDING), F.col(ENTRY_STEP).cast("long"))
    for role, value in SHARED_SEGMENTS.items():
        segment = segment.when(F.col(ROLE) == F.lit(role), F.lit(value).cast("long"))
    return state.withColumn(SEGMENT, segment)


@dataclass(frozen=True)
class StepSummary:
    """A step's summary rows decoded: its counts (summed over buckets; the late rows'
    minimum metrics by minimum), each bucket's load and the buckets' key sketches (none
    unless ``key_counts: sketch``) as their rows hold them (``joins.ssbj.buckets.sketch_json``):
    they are read where they merge into the operator's."""

    counts: Counter[str]
    loads: list[BucketLoad]
    sketches: list[bytes]

    @classmethod
    def of_rows(cls, rows: Iterable[tuple[Any, ...]], buckets: int) -> StepSummary:
        """Decode :func:`summary_of`'s rows of a step over ``buckets`` buckets."""
        counts: Counter[str] = Counter()
        load_rows = []
        sketches = []
        for role, name, value, label, key_hash, stored, probes, sketch in rows:
            if role == METRIC_ROLE and name in LATE_MIN_METRICS:
                counts[name] = min(int(value), counts.get(name, int(value)))
            elif role == METRIC_ROLE:
                counts[name] += int(value)
            elif role == KEY_LOAD:
                load_rows.append((label, key_hash, stored, probes))
            elif role == KEY_SKETCH:
                sketches.append(bytes(sketch))
        return cls(counts, bucket_loads(load_rows, buckets), sketches)


@dataclass(frozen=True)
class CollectedResult:
    """A step result collected as Arrow, split once: its decoded summary and
    :func:`state_of`'s new state (with ``_segment`` when asked), as zero-copy slices."""

    summary: StepSummary
    state: pa.Table


def split_collected(result: pa.Table, buckets: int, segmented: bool = False) -> CollectedResult:
    """:func:`summary_of` (decoded) and :func:`state_of` of a step result over ``buckets``
    buckets, collected as Arrow.

    Written apart from the Spark pair because the result's roles are runs of rows: a
    slice per run copies nothing where a filter would copy every column
    (``common.rows``); ``tests/pipeline/ssbj/test_stage.py`` holds both placements to
    the same output and state."""
    roles = result.column(ROLE)
    # The summary rows are the result's last runs, and few: read by column, not as a dict
    # per row.
    summary = rows_where(
        result.select(list(_SUMMARY_COLUMNS)),
        pc.is_in(roles, pa.array([METRIC_ROLE, KEY_LOAD, KEY_SKETCH])),
    )
    state = rows_where(result, pc.is_in(roles, pa.array(list(STATE_ROLES))))
    state = state.drop_columns(list(_LOAD_COLUMNS))
    return CollectedResult(
        StepSummary.of_rows(zip(*(c.to_pylist() for c in summary.columns), strict=True), buckets),
        with_segments(state) if segmented else state,
    )


def bucket_loads(
    rows: Sequence[tuple[int, int | None, int, int]], buckets: int
) -> list[BucketLoad]:
    """Each bucket's load from its ``key_load`` rows ``(label, key hash, stored, probes)``:
    the row with no hash holds its totals, the others its heaviest keys."""
    bucket_of = {label: b for b, label in enumerate(task_labels(buckets))}
    totals: dict[int, tuple[int, int]] = {}
    keys: dict[int, list[KeyLoad]] = {}
    for label, key_hash, stored, probes in rows:
        if label not in bucket_of:
            raise ValueError(f"a load row of bucket label {label}: not one of {buckets} buckets")
        bucket = bucket_of[label]
        if key_hash is None:
            totals[bucket] = (int(stored), int(probes))
        else:
            keys.setdefault(bucket, []).append(KeyLoad(int(key_hash), int(stored), int(probes)))
    return [
        BucketLoad(b, stored, probes, tuple(keys.get(b, ())))
        for b, (stored, probes) in sorted(totals.items())
    ]


def summary_of(result: DataFrame) -> DataFrame:
    """The step's counters and the buckets' loads, for one collect on the driver.

    Rows ``(role, name, value, label, key hash, stored, probes, sketch)``: role ``metric``
    rows are counters (a few per bucket: the driver sums them, which spares the step a
    shuffle), role ``key_load`` rows are loads (``joins.ssbj.buckets.key_loads``, read by
    :func:`bucket_loads`), role ``key_sketch`` rows the buckets' key sketches; decoded by
    :meth:`StepSummary.of_rows`."""
    return result.where(F.col(ROLE).isin(METRIC_ROLE, KEY_LOAD, KEY_SKETCH)).select(
        *_SUMMARY_COLUMNS
    )


def pending_tuples(state: Rows) -> Rows:
    """The tuples a state table holds unanswered, H_S and the late rows: the stream
    tuples (their own names), their entry step (null for a late row) and
    :data:`WAITING_SINCE`, when a tuple that waits for a late master row first met none
    (null for the others)."""
    return Rows.apply(_pending_tuples, state)


def _pending_tuples(state: Frame) -> Frame:
    prefix = stream_field("")
    stream = [c for c in state.collect_schema().names() if c.startswith(prefix)]
    rows = with_timestamp_of_micros(
        state.filter(nw.col(ROLE).is_in([PENDING, LATE])), LATE_SINCE, WAITING_SINCE
    )
    return rows.select(
        *[nw.col(c).alias(c[len(prefix) :]) for c in stream],
        nw.col(ENTRY_STEP),
        nw.col(WAITING_SINCE),
    )


def cache_entries(state: DataFrame, spec: JoinSpec) -> DataFrame:
    """H_R from a state table: master rows (their own names) and the empty-entry marker."""
    return state.where(F.col(ROLE) == CACHE).select(
        *[F.col(master_field(c)).alias(c) for c in spec.master_columns], F.col(EMPTY)
    )


SEGMENT = "_segment"
# The segment of every state role but ``pending`` (whose segment is its entry step).
SHARED_SEGMENTS: Mapping[str, int] = {CACHE: -1, COUNTER: -2, MARKED: -3, SWITCH: -5, LATE: -4}

# Segment -> (rows, of them matched): what the state table holds, by segment.
Prints = dict[int, tuple[int, int]]


def segment_column(state: pa.Table) -> pa.Array:
    """Each state row's segment (see the module docstring)."""
    if state.num_rows == 0:
        return pa.array([], pa.int64())
    roles = state.column(ROLE)
    # One pass over the role strings: each row's role as its place in ``named``.
    named = [PENDING, *SHARED_SEGMENTS]
    place = pc.index_in(roles, value_set=pa.array(named))
    if place.null_count:
        unknown = pc.unique(roles.filter(pc.is_null(place))).to_pylist()
        raise ValueError(f"operator state rows of roles {unknown}: not state roles")
    places = np.asarray(place.to_numpy(zero_copy_only=False), dtype=np.int64)
    segments = np.array([0, *SHARED_SEGMENTS.values()], dtype=np.int64)[places]
    pending = places == 0
    if pending.any():
        entry = state.column(ENTRY_STEP).to_numpy(zero_copy_only=False)
        steps = np.asarray(entry[pending], dtype=np.float64)
        if np.isnan(steps).any():
            raise ValueError("a pending tuple of the operator state has no entry step")
        segments[pending] = steps.astype(np.int64)
    return pa.array(segments, pa.int64())


def with_segments(state: pa.Table) -> pa.Table:
    """``state`` with its ``_segment`` column (replaced if it has one)."""
    if SEGMENT in state.column_names:
        state = state.drop_columns([SEGMENT])
    return state.append_column(SEGMENT, segment_column(state))


def prints_of(state: pa.Table) -> Prints:
    """``(rows, matched)`` of each segment of a state table with ``_segment``."""
    if state.num_rows == 0:
        return {}
    # Counted over runs of equal segments (a state's segments are a few runs), then the
    # runs of each segment added up: no hash group-by over every row.
    segments = np.asarray(state.column(SEGMENT).to_numpy(zero_copy_only=False), np.int64)
    matched = np.asarray(
        pc.fill_null(state.column(MATCHED), False).to_numpy(zero_copy_only=False), np.int64
    )
    starts = np.flatnonzero(np.concatenate([[True], segments[1:] != segments[:-1]]))
    rows = np.diff(np.append(starts, len(segments)))
    found: Prints = {}
    for segment, n, m in zip(
        segments[starts].tolist(),
        rows.tolist(),
        np.add.reduceat(matched, starts).tolist(),
        strict=True,
    ):
        known = found.get(segment, (0, 0))
        found[segment] = (known[0] + n, known[1] + m)
    return found


@dataclass(frozen=True)
class SegmentWrite:
    """What a step writes to a segmented state table: the rows of ``segments``, which
    replace those segments' rows (a segment without rows here is removed)."""

    segments: tuple[int, ...]
    rows: pa.Table


def changed_segments(
    new: pa.Table, new_prints: Prints, stored: Prints, before: pa.Table | None
) -> SegmentWrite:
    """The segments of the new state ``new`` (with ``_segment``; ``new_prints`` its
    :func:`prints_of`) that differ from the stored table's (``stored``: its prints;
    ``before``: its rows with ``_segment``, when at hand), and their rows.

    Why a chunk's fingerprint, ``(rows, matched)``, is enough to know it unchanged: a
    pending tuple's row is fixed when it enters H_S except its matched flag, which only
    turns true (``joins.ssbj.algorithm.PendingTuple``), and tuples leave a chunk only when
    it expires (whole) or a backfill suppresses them (fewer rows). The other segments have
    no such invariant and are compared whole, with the rows the last step left, when those
    are at hand; when they are not, a non-empty one is rewritten."""
    changed = set(stored) ^ set(new_prints)
    changed |= {s for s in set(stored) & set(new_prints) if stored[s] != new_prints[s]}
    compared = sorted(s for s in set(stored) & set(new_prints) - changed if s < 0)
    if compared and before is None:
        changed.update(compared)
    elif compared:
        assert before is not None
        for segment in compared:
            if not _rows_in(before, segment).equals(_rows_in(new, segment)):
                changed.add(segment)
    ordered = tuple(sorted(changed))
    if not ordered:
        return SegmentWrite((), new.slice(0, 0))
    keep = pc.is_in(new.column(SEGMENT), value_set=pa.array(ordered, pa.int64()))
    return SegmentWrite(ordered, rows_where(new, keep))


def _rows_in(state: pa.Table, segment: int) -> pa.Table:
    """The rows of one segment (a run of the state's rows: a slice, no copy)."""
    return rows_where(state, pc.equal(state.column(SEGMENT), segment))
