"""One bucket's step result encoded as Arrow: the output rows, the new state, the counters.

The result has the wide table's columns (``joins.ssbj.bucket_decode.WideLayout``): the
enriched rows (role ``out``), the bucket's new state (roles in
:data:`joins.ssbj.roles.STATE_ROLES`) and its counters (role ``metric``). Stream tuples
carry their position in the bucket's input table, so their columns are gathered from it
in Arrow; with late rows (``joins.ssbj.late``) the unmatched tuples wait or expire here.
pyarrow only, no Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa

from common.rows import TableOfParts
from joins.ssbj import roles
from joins.ssbj.algorithm import Row, StepCounts, StepPlan, StepResult
from joins.ssbj.bucket_decode import WideLayout
from joins.ssbj.late import LateRule, SortedLateRows, settle_unmatched


def _key_columns(layout: WideLayout, keys: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Key-only master rows as columns: the join values, every other master column null."""
    return {
        roles.master_field(c): [key[i] for key in keys] for i, c in enumerate(layout.master_keys)
    }


def _columns(names: Sequence[str], rows: Sequence[Row]) -> dict[str, list[Any]]:
    if not rows:
        return {n: [] for n in names}
    return dict(zip(names, (list(c) for c in zip(*rows, strict=True)), strict=True))


def _gathered(source: pa.Table, layout: WideLayout, rows: Sequence[Row]) -> dict[str, Any]:
    """The stream columns of decoded stream tuples, taken by position from ``source``,
    with when each first met no master row (``joins.ssbj.late``: null for most)."""
    positions = pa.array([row[-1] for row in rows], pa.int64())
    carried = [*layout.stream_fields, roles.LATE_SINCE]
    taken = source.select(carried).take(positions)
    return {name: taken.column(name) for name in carried}


@dataclass(frozen=True)
class LateRows:
    """A bucket's late rows sorted out for the step (``joins.ssbj.late``), and whether the
    rule its step settles them by."""

    rule: LateRule
    sorted: SortedLateRows


# Metrics of the late rows whose buckets' values the driver takes the least of, not the sum.
LATE_MIN_METRICS = ("late_oldest_us", "late_min_version")


def _settle(
    result: StepResult, source: pa.Table, late: LateRows, layout: WideLayout, enc: TableOfParts
) -> tuple[list[tuple[Row, Row | None, int | None]], list[tuple[str, int]]]:
    """The output rows a step with late rows emits, its new late rows (added to ``enc``)
    and their metrics. ``output_rows`` becomes what is emitted."""
    rule, out = late.rule, result.output
    settled = settle_unmatched(out, source, rule)
    unmatched_kept = set(settled.emitted)
    emitted = [row for i, row in enumerate(out) if row[1] is not None or i in unmatched_kept]
    gathered = _gathered(source, layout, [out[i][0] for i in settled.waiting])
    gathered[roles.LATE_SINCE] = pa.array(settled.since, pa.int64())
    enc.add(roles.LATE, len(settled.waiting), gathered | {roles.PINNED_VERSION: settled.pinned})
    kept = late.sorted.waiting
    enc.add(
        roles.LATE, kept.num_rows, {c: kept.column(c) for c in kept.column_names if c != roles.ROLE}
    )
    expired = late.sorted.expired
    if rule.left_join:
        enc.add(roles.OUT, expired.num_rows, {f: expired.column(f) for f in layout.stream_fields})
    # Tuples that waited before carry a since: which of them were answered, which wait on.
    since = source.column(roles.LATE_SINCE)
    carried = since.to_pylist() if since.null_count < len(since) else [None] * len(since)
    answered = {s[-1] for s, m, _ in out if m is not None and carried[s[-1]] is not None}
    pending_since = [carried[t.row[-1]] for t in result.state.pending]
    waits_since = [
        *settled.since,
        *kept.column(roles.LATE_SINCE).to_pylist(),
        *(v for v in pending_since if v is not None),
    ]
    pinned = [*settled.pinned, *kept.column(roles.PINNED_VERSION).to_pylist()]
    result.counts.output_rows = len(emitted) + (expired.num_rows if rule.left_join else 0)
    metrics = [
        ("late_entered", sum(1 for i in settled.waiting if carried[out[i][0][-1]] is None)),
        ("late_answered", len(answered)),
        ("late_expired", settled.expired_waiters + expired.num_rows),
        ("late_rows", len(settled.waiting) + kept.num_rows),
        ("late_waiting", len(waits_since)),
    ]
    if waits_since:
        metrics.append(("late_oldest_us", min(int(v) for v in waits_since if v is not None)))
    if pinned:
        metrics.append(("late_min_version", min(int(v) for v in pinned if v is not None)))
    return emitted, metrics


def encode_result(
    result: StepResult,
    layout: WideLayout,
    plan: StepPlan,
    source: pa.Table,
    schema: pa.Schema,
    late: LateRows | None = None,
) -> pa.Table:
    """The step's output rows, the bucket's new state and its counters, as one table.

    ``source`` is the bucket's input table, which decoded stream tuples point into. With
    ``late`` the unmatched tuples of the output wait or expire (``joins.ssbj.late``), and
    the bucket's late rows are sorted out of ``source`` already."""
    enc = TableOfParts(schema, roles.ROLE)
    width = len(layout.master_columns)
    nothing: Row = (None,) * width
    out = result.output
    late_metrics: list[tuple[str, int]] = []
    if late is not None:
        out, late_metrics = _settle(result, source, late, layout, enc)
    enc.add(
        roles.OUT,
        len(out),
        _gathered(source, layout, [s for s, _, _ in out])
        | _columns(layout.master_fields, [m if m is not None else nothing for _, m, _ in out])
        | {roles.VERSION: [v for _, _, v in out]},
    )
    state = result.state
    enc.add(
        roles.PENDING,
        len(state.pending),
        _gathered(source, layout, [t.row for t in state.pending])
        | {
            roles.ENTRY_STEP: [t.entry_step for t in state.pending],
            roles.PINNED_VERSION: [t.pinned_version for t in state.pending],
            roles.MATCHED: [t.matched for t in state.pending],
        },
    )
    cache_rows = [row for rows in state.cache.values() for row in rows]
    enc.add(
        roles.CACHE,
        len(cache_rows),
        _columns(layout.master_fields, cache_rows) | {roles.EMPTY: [False] * len(cache_rows)},
    )
    empty = [key for key, rows in state.cache.items() if not rows]
    enc.add(
        roles.CACHE, len(empty), _key_columns(layout, empty) | {roles.EMPTY: [True] * len(empty)}
    )
    counters = list(state.counters.items())
    enc.add(
        roles.COUNTER,
        len(counters),
        _key_columns(layout, [k for k, _ in counters])
        | {
            roles.HITS: [c.hits for _, c in counters],
            roles.MASTER_ROWS: [c.master_rows for _, c in counters],
            roles.OBSERVED: [c.observed for _, c in counters],
        },
    )
    marked = list(state.switch_buffer)
    enc.add(roles.MARKED, len(marked), _key_columns(layout, marked))
    collected = [row for rows in state.switch_buffer.values() for row in rows]
    enc.add(roles.SWITCH, len(collected), _columns(layout.master_fields, collected))
    metrics = [(f.name, int(getattr(result.counts, f.name))) for f in fields(StepCounts)]
    metrics += late_metrics
    enc.add(
        roles.METRIC_ROLE,
        len(metrics),
        {roles.METRIC: [name for name, _ in metrics], roles.VALUE: [value for _, value in metrics]},
    )
    return enc.table()
