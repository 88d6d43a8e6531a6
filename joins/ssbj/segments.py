"""The operator state table in segments, so that a step rewrites what changed, not H_S.

The state table (``joins.ssbj.roles``: one row per item of H_S, H_R, the counters and
s_B) is partitioned by ``_segment``:

- a pending tuple of H_S: its entry step (>= 0), its chunk of Algorithm 1's queue Q;
- H_R (role ``cache``): -1; the counters: -2; the values marked for s_B (``marked``):
  -3; the rows s_B collected (``switch``): -5; the tuples waiting for late master rows:
  -4. The marks are set at a switching cycle's first step and the rows grow every step of
  it: apart, a step of that cycle rewrites the rows, not the marks.

A step replaces only the segments whose rows changed, in one commit: the chunk its new
tuples entered, the chunk that expired (removed, nothing written), and the other segments
when their content changed. A step's writes then grow with its input and with what the
cache and counters did, not with H_S.

Why a chunk's fingerprint, ``(rows, matched)``, is enough to know it unchanged: a pending
tuple's row is fixed when it enters H_S except its matched flag, which only turns true
(``joins.ssbj.algorithm.PendingTuple``), and tuples leave a chunk only when it expires
(whole) or a backfill suppresses them (fewer rows). The other segments have no such
invariant and are compared whole, with the rows the last step left, when those are at
hand (:func:`changed_segments`); when they are not, a non-empty one is rewritten.

Plain pyarrow (no Spark); the Spark path computes the same column with
``joins.ssbj.step.state_of``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.arrow_rows import rows_where
from joins.ssbj.roles import (
    CACHE,
    COUNTER,
    ENTRY_STEP,
    LATE,
    MARKED,
    MATCHED,
    PENDING,
    ROLE,
    SWITCH,
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
    ``before``: its rows with ``_segment``, when at hand), and their rows."""
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
