"""One key bucket of the SSBJ operator as Arrow: decode its rows, run Algorithm 1, encode.

A step's input is one wide table: every row carries a ``_role`` saying what it is (a new
stream tuple, a pending tuple, a cache row, a master partition row, ...) and the columns of
that role; the others are null. Stream columns are stored as ``s__<name>``, master columns
as ``r__<name>``, so the two sides never collide. The output has the same columns: the
enriched rows (role ``out``), the bucket's new state (roles in :data:`STATE_ROLES`) and its
counters (role ``metric``). This module depends on pyarrow only; ``joins.ssbj.step`` builds the
table with Spark and calls :func:`bucket_step` from ``groupBy(bucket).applyInArrow``.

A stream tuple reaches Algorithm 1 as ``(*join values, position in the bucket's table)``:
the algorithm only looks at the join value and carries the tuple, so the tuple's other
columns stay in Arrow and are gathered by position when the output and the new H_S are
encoded (decoding every column to Python objects was most of a step's time). Master rows
are decoded whole (the cache compares them by value when the master's changes arrive),
and of a master partition only the rows whose join value the bucket's tuples or s_B ask for.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from common.arrow_rows import rows_at
from joins.skew.asketch import ASketch, SketchShape
from joins.ssbj.algorithm import (
    BucketState,
    KeyCounters,
    MasterDelta,
    PendingTuple,
    Reload,
    Row,
    RowChanges,
    StepCounts,
    StepPlan,
    StepResult,
    join_value,
    run_step,
)
from joins.ssbj.columnar import ColumnarLayout, columnar_result, supports
from joins.ssbj.key_loads import key_loads, key_loads_by_bucket
from joins.ssbj.late import (
    LateRule,
    SortedLateRows,
    settle_unmatched,
    sort_late_rows,
)
from joins.ssbj.roles import (  # noqa: F401  (re-exported: the wide table's names)
    ADDED,
    ASKING_ROLES,
    BUCKET,
    CACHE,
    CACHE_CHANGE,
    CHANGE,
    COUNTER,
    EMPTY,
    ENTRY_STEP,
    HITS,
    KEY_HASH,
    KEY_LOAD,
    KEY_SKETCH,
    LATE,
    LATE_SINCE,
    LOADED_ROLES,
    MARKED,
    MASTER_ROWS,
    MATCHED,
    METRIC,
    METRIC_ROLE,
    NEW,
    OBSERVED,
    OUT,
    PARTITION,
    PENDING,
    PINNED_VERSION,
    PROBES,
    PROBING_ROLES,
    RELOAD,
    REMOVED,
    RETURNING,
    ROLE,
    SKETCH,
    STATE_ROLES,
    STORED,
    STREAM_ROLES,
    SWITCH,
    SWITCH_CHANGE,
    VALUE,
    VERSION,
    master_field,
    stream_field,
)


@dataclass(frozen=True)
class WideLayout:
    """Column names of the wide table, and which positions hold the join values."""

    stream_columns: tuple[str, ...]
    master_columns: tuple[str, ...]
    stream_keys: tuple[str, ...]
    master_keys: tuple[str, ...]

    @property
    def stream_key_positions(self) -> tuple[int, ...]:
        """Where a decoded stream tuple holds its join values: first, before the position."""
        return tuple(range(len(self.stream_keys)))

    @property
    def master_key_positions(self) -> tuple[int, ...]:
        return tuple(self.master_columns.index(c) for c in self.master_keys)

    @property
    def stream_fields(self) -> list[str]:
        return [stream_field(c) for c in self.stream_columns]

    @property
    def master_fields(self) -> list[str]:
        return [master_field(c) for c in self.master_columns]


@dataclass(frozen=True)
class BucketDeltas:
    """How H_R and s_B reach the plan's master version: by the rows commits changed
    (``changes``), by the rows at the new version (``reload``), or not at all (None)."""

    cache: str | None = None
    switch: str | None = None


def _rows(table: pa.Table, columns: Sequence[str]) -> list[Row]:
    if table.num_rows == 0:
        return []
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


class _Roles:
    """The rows of one bucket's table by role, with their positions in the table."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._roles = table.column(ROLE)

    def positions(self, role: str) -> pa.Array:
        return pc.indices_nonzero(pc.equal(self._roles, role))

    def rows(self, role: str) -> pa.Table:
        # A role's rows are one run of the bucket's rows (``common.arrow_rows``): a slice.
        return rows_at(self.table, self.positions(role))

    def stream_tuples(self, role: str, layout: WideLayout) -> tuple[list[Row], pa.Table]:
        """``(*join values, position)`` of the role's stream tuples, and their rows."""
        positions = self.positions(role)
        rows = rows_at(self.table, positions)
        keys = [rows.column(stream_field(c)).to_pylist() for c in layout.stream_keys]
        return list(zip(*keys, positions.to_pylist(), strict=True)), rows


def _delta(roles: _Roles, role: str, kind: str | None, layout: WideLayout) -> MasterDelta | None:
    if kind is None:
        return None
    if kind == "reload":
        return Reload(_rows(roles.rows(RELOAD), layout.master_fields))
    changes = roles.rows(role)
    change = changes.column(CHANGE).to_pylist()
    rows = _rows(changes, layout.master_fields)
    return RowChanges(
        removed=[r for r, c in zip(rows, change, strict=True) if c == REMOVED],
        added=[r for r, c in zip(rows, change, strict=True) if c == ADDED],
    )


def decode_state(roles: _Roles, layout: WideLayout, plan: StepPlan) -> BucketState:
    state = BucketState()
    tuples, pending = roles.stream_tuples(PENDING, layout)
    for row, entry, pinned, matched in zip(
        tuples,
        pending.column(ENTRY_STEP).to_pylist(),
        pending.column(PINNED_VERSION).to_pylist(),
        pending.column(MATCHED).to_pylist(),
        strict=True,
    ):
        state.pending.append(
            PendingTuple(row, plan.stream_key_of(row), entry, pinned, bool(matched))
        )
    cache = roles.rows(CACHE)
    for row, empty in zip(
        _rows(cache, layout.master_fields), cache.column(EMPTY).to_pylist(), strict=True
    ):
        rows = state.cache.setdefault(plan.master_key_of(row), [])
        if not empty:
            rows.append(row)
    counters = roles.rows(COUNTER)
    for key, hits, master_rows, observed in zip(
        _keys(counters, layout),
        counters.column(HITS).to_pylist(),
        counters.column(MASTER_ROWS).to_pylist(),
        counters.column(OBSERVED).to_pylist(),
        strict=True,
    ):
        known = state.counters.get(key)
        if known is None:
            state.counters[key] = KeyCounters(hits, master_rows, observed)
        else:
            # A split key's replicas hand their counters to its owner: hits add up (each
            # counted its own tuples); master rows were counted over the same partitions.
            state.counters[key] = KeyCounters(
                known.hits + hits,
                max(known.master_rows, master_rows),
                max(known.observed, observed),
            )
    for key in _keys(roles.rows(MARKED), layout):
        state.switch_buffer.setdefault(key, [])
    for row in _rows(roles.rows(SWITCH), layout.master_fields):
        state.switch_buffer.setdefault(plan.master_key_of(row), []).append(row)
    return state


def _partition_rows(
    roles: _Roles, layout: WideLayout, wanted: set[tuple[Any, ...]]
) -> dict[int, list[Row]]:
    """The bucket's master partition rows by version, only of the ``wanted`` join values
    (with one join column the others are dropped in Arrow, before any is decoded)."""
    parts = roles.rows(PARTITION)
    if len(layout.master_keys) == 1 and parts.num_rows:
        column = parts.column(master_field(layout.master_keys[0]))
        values = pa.array([key[0] for key in wanted], type=column.type)
        if pa.types.is_floating(column.type):
            # is_in hashes bits: -0.0 would miss 0.0, and a NaN of other bits would miss
            # NaN (both equal in the join). One zero and one NaN on both sides.
            zero, nan = pa.scalar(0.0, column.type), pa.scalar(float("nan"), column.type)
            column = pc.if_else(
                pc.is_nan(column), nan, pc.if_else(pc.equal(column, zero), zero, column)
            )
            values = pc.if_else(
                pc.is_nan(values), nan, pc.if_else(pc.equal(values, zero), zero, values)
            )
        parts = parts.filter(pc.is_in(column, value_set=values))
    partitions: dict[int, list[Row]] = {}
    for row, version in zip(
        _rows(parts, layout.master_fields), parts.column(VERSION).to_pylist(), strict=True
    ):
        partitions.setdefault(int(version), []).append(row)
    return partitions


def _keys(table: pa.Table, layout: WideLayout) -> list[tuple[Any, ...]]:
    """The join values of key-only master rows (counters, marked values), decoded from
    the key columns alone, as :func:`joins.ssbj.algorithm.join_value` makes them."""
    rows = _rows(table, [master_field(c) for c in layout.master_keys])
    return [join_value(row, range(len(layout.master_keys))) for row in rows]


def _key_columns(layout: WideLayout, keys: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Key-only master rows as columns: the join values, every other master column null."""
    return {master_field(c): [key[i] for key in keys] for i, c in enumerate(layout.master_keys)}


class _Encoder:
    """Rows of several roles into one table with the wide schema (absent columns null)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.parts: list[pa.Table] = []

    def add(self, role: str, n: int, columns: dict[str, Any]) -> None:
        """``columns``: Python lists, or Arrow columns already of the schema's types."""
        if n == 0:
            return
        arrays: list[Any] = []
        for f in self.schema:
            value = columns.get(f.name)
            if f.name == ROLE:
                arrays.append(pa.repeat(pa.scalar(role, f.type), n))
            elif value is None:
                arrays.append(pa.nulls(n, f.type))
            elif isinstance(value, pa.ChunkedArray | pa.Array):
                arrays.append(value.cast(f.type))
            else:
                arrays.append(pa.array(value, f.type))
        self.parts.append(pa.Table.from_arrays(arrays, schema=self.schema).combine_chunks())

    def table(self) -> pa.Table:
        if not self.parts:
            return self.schema.empty_table()
        return pa.concat_tables(self.parts)


def _columns(names: Sequence[str], rows: Sequence[Row]) -> dict[str, list[Any]]:
    if not rows:
        return {n: [] for n in names}
    return dict(zip(names, (list(c) for c in zip(*rows, strict=True)), strict=True))


def _gathered(source: pa.Table, layout: WideLayout, rows: Sequence[Row]) -> dict[str, Any]:
    """The stream columns of decoded stream tuples, taken by position from ``source``,
    with when each first met no master row (``joins.ssbj.late``: null for most)."""
    positions = pa.array([row[-1] for row in rows], pa.int64())
    carried = [*layout.stream_fields, LATE_SINCE]
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
    result: StepResult, source: pa.Table, late: LateRows, layout: WideLayout, enc: _Encoder
) -> tuple[list[tuple[Row, Row | None, int | None]], list[tuple[str, int]]]:
    """The output rows a step with late rows emits, its new late rows (added to ``enc``)
    and their metrics. ``output_rows`` becomes what is emitted."""
    rule, out = late.rule, result.output
    settled = settle_unmatched(out, source, rule)
    unmatched_kept = set(settled.emitted)
    emitted = [row for i, row in enumerate(out) if row[1] is not None or i in unmatched_kept]
    gathered = _gathered(source, layout, [out[i][0] for i in settled.waiting])
    gathered[LATE_SINCE] = pa.array(settled.since, pa.int64())
    enc.add(LATE, len(settled.waiting), gathered | {PINNED_VERSION: settled.pinned})
    kept = late.sorted.waiting
    enc.add(LATE, kept.num_rows, {c: kept.column(c) for c in kept.column_names if c != ROLE})
    expired = late.sorted.expired
    if rule.left_join:
        enc.add(OUT, expired.num_rows, {f: expired.column(f) for f in layout.stream_fields})
    # Tuples that waited before carry a since: which of them were answered, which wait on.
    since = source.column(LATE_SINCE)
    carried = since.to_pylist() if since.null_count < len(since) else [None] * len(since)
    answered = {s[-1] for s, m, _ in out if m is not None and carried[s[-1]] is not None}
    pending_since = [carried[t.row[-1]] for t in result.state.pending]
    waits_since = [
        *settled.since,
        *kept.column(LATE_SINCE).to_pylist(),
        *(v for v in pending_since if v is not None),
    ]
    pinned = [*settled.pinned, *kept.column(PINNED_VERSION).to_pylist()]
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
    enc = _Encoder(schema)
    width = len(layout.master_columns)
    nothing: Row = (None,) * width
    out = result.output
    late_metrics: list[tuple[str, int]] = []
    if late is not None:
        out, late_metrics = _settle(result, source, late, layout, enc)
    enc.add(
        OUT,
        len(out),
        _gathered(source, layout, [s for s, _, _ in out])
        | _columns(layout.master_fields, [m if m is not None else nothing for _, m, _ in out])
        | {VERSION: [v for _, _, v in out]},
    )
    state = result.state
    enc.add(
        PENDING,
        len(state.pending),
        _gathered(source, layout, [t.row for t in state.pending])
        | {
            ENTRY_STEP: [t.entry_step for t in state.pending],
            PINNED_VERSION: [t.pinned_version for t in state.pending],
            MATCHED: [t.matched for t in state.pending],
        },
    )
    cache_rows = [row for rows in state.cache.values() for row in rows]
    enc.add(
        CACHE,
        len(cache_rows),
        _columns(layout.master_fields, cache_rows) | {EMPTY: [False] * len(cache_rows)},
    )
    empty = [key for key, rows in state.cache.items() if not rows]
    enc.add(CACHE, len(empty), _key_columns(layout, empty) | {EMPTY: [True] * len(empty)})
    counters = list(state.counters.items())
    enc.add(
        COUNTER,
        len(counters),
        _key_columns(layout, [k for k, _ in counters])
        | {
            HITS: [c.hits for _, c in counters],
            MASTER_ROWS: [c.master_rows for _, c in counters],
            OBSERVED: [c.observed for _, c in counters],
        },
    )
    marked = list(state.switch_buffer)
    enc.add(MARKED, len(marked), _key_columns(layout, marked))
    collected = [row for rows in state.switch_buffer.values() for row in rows]
    enc.add(SWITCH, len(collected), _columns(layout.master_fields, collected))
    metrics = [(f.name, int(getattr(result.counts, f.name))) for f in fields(StepCounts)]
    metrics += late_metrics
    enc.add(
        METRIC_ROLE,
        len(metrics),
        {METRIC: [name for name, _ in metrics], VALUE: [value for _, value in metrics]},
    )
    return enc.table()


LOAD_FIELDS = (
    pa.field(BUCKET, pa.int32()),
    pa.field(KEY_HASH, pa.int64()),
    pa.field(STORED, pa.int64()),
    pa.field(PROBES, pa.int64()),
    pa.field(SKETCH, pa.binary()),
)


def bucket_step(
    table: pa.Table,
    layout: WideLayout,
    plan: StepPlan,
    deltas: BucketDeltas,
    top_keys: int = 0,
    split_owners: Mapping[int, int] | None = None,
    tracked: Sequence[int] | None = None,
    sketch: SketchShape | None = None,
    split_ways: Mapping[int, int] | None = None,
    late: LateRule | None = None,
    columnar: bool = True,
) -> pa.Table:
    """Run one step for the rows of one bucket (any role mix) and encode what it yields.

    ``plan`` must locate join values as this module decodes them: ``stream_key`` is
    ``layout.stream_key_positions`` and ``master_key`` is ``layout.master_key_positions``.
    When the rows carry their key hash (``_key_hash``, beside the bucket label), the result
    also has the bucket's load rows (:func:`key_loads`, role ``key_load``) and the columns
    :data:`LOAD_FIELDS`; otherwise it has the input's columns.

    ``split_owners`` maps the hashes of split keys to their owner's bucket label
    (``joins.skew.key_routing``). In a bucket that is not a key's owner (a replica), the key's
    cache rows and s_B are copies for this step: the replica answers its tuples (from s_B
    too, at the phase-out step that makes it the cache) and keeps neither, so the state
    holds each cache row and s_B entry once. Its waiting tuples stay in the state (the
    next step routes them by tuple again) and its counters reach the owner there, merged
    by :func:`decode_state`. ``split_ways`` gives
    each split key's number of buckets: its owner weighs its share of the key's waiting
    tuples by it when deciding the switch into the cache (``run_step``'s ``spread``).

    ``tracked`` (key hashes) and ``sketch`` bound the per-value counters for large key
    domains: only the tracked values are instrumented (``run_step``'s ``tracked``), and
    the bucket reports an ASketch of the shape ``sketch`` over its new tuples' key hashes
    (role ``key_sketch``, :func:`new_key_sketch`), which the operator merges across buckets
    to choose the next step's tracked values. Both need the key hash column.

    ``late`` (a stage whose tuples may wait for late master rows, ``joins.ssbj.late``)
    sorts out the bucket's late rows first and settles the unmatched tuples after; the
    plan must then be a left join's (Algorithm 1 emits every tuple that met no row).

    Within its scope (``joins.ssbj.columnar``) the step runs on Arrow columns; elsewhere,
    or without ``columnar``, Algorithm 1's reference model runs on decoded tuples.
    """
    if (plan.stream_key, plan.master_key) != (
        layout.stream_key_positions,
        layout.master_key_positions,
    ):
        raise ValueError(
            f"plan key positions {plan.stream_key}/{plan.master_key} do not match the "
            f"decoded rows' {layout.stream_key_positions}/{layout.master_key_positions}"
        )
    if late is not None and not plan.left_join:
        raise ValueError("a step that keeps late rows runs Algorithm 1 as a left join")
    names = table.schema.names
    if KEY_HASH in names:
        table = unasked_partition_rows_dropped(table)
        if table.num_rows == 0:  # only partition rows, none asked for: as if never sent
            state_fields = [f for f in table.schema if f.name not in (BUCKET, KEY_HASH)]
            return pa.schema([*state_fields, *LOAD_FIELDS]).empty_table()
    replicated = _replicated_hashes(table, split_owners or {})
    loads = key_loads(table, top_keys, replicated) if KEY_HASH in names else None
    replica_keys = _keys_of(table, replicated, layout, plan)
    tracked_keys = None
    if tracked is not None:
        tracked_keys = frozenset(
            _keys_of(table, pa.array(tracked, pa.int64()), layout, plan, stream_only=True)
        )
    partial = new_key_sketch(table, layout, sketch) if sketch is not None else None
    spread = _owned_spread(table, split_owners or {}, split_ways or {}, layout, plan)
    table = table.drop_columns([c for c in (BUCKET, KEY_HASH) if c in names])
    late_rows = None
    if late is None:
        _refuse_late_rows(table)
    else:
        sorted_rows = sort_late_rows(table, late)
        table = sorted_rows.table
        late_rows = LateRows(late, sorted_rows)
    encoded = None
    if columnar:
        shape = _columnar_layout(layout, deltas, split_owners, late)
        if shape is not None:
            schema = table.schema if loads is None else pa.schema([*table.schema, *LOAD_FIELDS])
            tracked_values = (
                None
                if tracked_keys is None
                else pa.array([key[0] for key in tracked_keys if key[0] is not None])
            )
            encoded = columnar_result(table, shape, plan, schema, tracked_values)
    if encoded is not None:
        return encoded if loads is None else _with_loads(encoded, loads, partial)
    roles = _Roles(table)
    state = decode_state(roles, layout, plan)
    new, _ = roles.stream_tuples(NEW, layout)
    returning, _ = roles.stream_tuples(RETURNING, layout)
    wanted = {t.key for t in state.pending} | {plan.stream_key_of(row) for row in new}
    wanted |= {plan.stream_key_of(row) for row in returning}
    wanted |= set(state.switch_buffer)
    result = run_step(
        plan,
        state,
        new,
        _partition_rows(roles, layout, wanted),
        cache_delta=_delta(roles, CACHE_CHANGE, deltas.cache, layout),
        switch_delta=_delta(roles, SWITCH_CHANGE, deltas.switch, layout),
        tracked=tracked_keys,
        spread=spread,
        returning=returning,
    )
    if replica_keys:
        kept = result.state
        kept.cache = {k: v for k, v in kept.cache.items() if k not in replica_keys}
        kept.switch_buffer = {k: v for k, v in kept.switch_buffer.items() if k not in replica_keys}
        result.counts.cache_rows = sum(max(1, len(rows)) for rows in kept.cache.values())
    if loads is None:
        return encode_result(result, layout, plan, table, table.schema, late_rows)
    schema = pa.schema([*table.schema, *LOAD_FIELDS])
    encoded = encode_result(result, layout, plan, table, schema, late_rows)
    return _with_loads(encoded, loads, partial)


def _refuse_late_rows(table: pa.Table) -> None:
    """Only a step that settles late rows may see them: another would drop them."""
    if pc.any(pc.equal(table.column(ROLE), LATE)).as_py():
        raise ValueError("a bucket holds late rows, but the step has no rule to settle them")


def _columnar_layout(
    layout: WideLayout,
    deltas: BucketDeltas,
    split_owners: Mapping[int, int] | None,
    late: LateRule | None,
) -> ColumnarLayout | None:
    """The columnar pass's layout for a step in its scope (``joins.ssbj.columnar``: one
    join column, no master changes to apply, no split keys, no late rows), else None."""
    if late is not None or split_owners or deltas.cache is not None or deltas.switch is not None:
        return None
    return ColumnarLayout.of(
        layout.stream_columns, layout.master_columns, layout.stream_keys, layout.master_keys
    )


def _with_loads(encoded: pa.Table, loads: pa.Table, partial: ASketch | None) -> pa.Table:
    """A bucket's encoded result with its load rows (and its key sketch) after it."""
    schema = encoded.schema
    enc = _Encoder(schema)
    enc.add(KEY_LOAD, loads.num_rows, {name: loads.column(name) for name in loads.column_names})
    if partial is not None:
        enc.add(
            KEY_SKETCH,
            1,
            {
                BUCKET: [loads.column(BUCKET)[0].as_py()],
                SKETCH: [_sketch_json(partial)],
            },
        )
    return pa.concat_tables([encoded, enc.table()])


def unasked_partition_rows_dropped(table: pa.Table) -> pa.Table:
    """The bucket's rows without the master partition rows whose key hash no new tuple,
    pending tuple or s_B value of the bucket has: they can match nothing this step.

    The same rows as a semi-join before the shuffle would leave (``joins.ssbj.step``'s
    ``semi_join``), up to hash collisions, which only keep a row the algorithm then
    compares by value; so a bucket's loads and result do not depend on which side
    dropped them."""
    roles = table.column(ROLE)
    partition = pc.equal(roles, PARTITION)
    if not pc.any(partition).as_py():
        return table
    hashes = table.column(KEY_HASH)
    asking = pc.is_in(roles, value_set=pa.array(ASKING_ROLES))
    asked = pc.unique(hashes.filter(asking))
    return table.filter(pc.or_(pc.invert(partition), pc.is_in(hashes, value_set=asked)))


def new_key_sketch(table: pa.Table, layout: WideLayout, shape: SketchShape) -> ASketch:
    """An ASketch of the key hashes of the bucket's new tuples whose join value has no
    null (those match nothing, and are never cached); each distinct hash is added with its
    count, in hash order, so the sketch is the same however the rows arrived."""
    if KEY_HASH not in table.schema.names:
        raise ValueError(f"a key sketch needs the {KEY_HASH} column, found {table.schema.names}")
    mask = pc.equal(table.column(ROLE), NEW)
    for name in layout.stream_keys:
        mask = pc.and_(mask, pc.is_valid(table.column(stream_field(name))))
    hashes = table.column(KEY_HASH).filter(mask)
    sketch = shape.empty()
    if len(hashes):
        counted = pc.value_counts(hashes.combine_chunks())
        values = counted.field("values").to_pylist()
        counts = counted.field("counts").to_pylist()
        for key, count in sorted(zip(values, counts, strict=True)):
            sketch.add(key, count)
    return sketch


def _replicated_hashes(table: pa.Table, split_owners: Mapping[int, int]) -> pa.Array | None:
    """The hashes of the split keys this bucket holds a replica of (not their owner)."""
    if not split_owners or table.num_rows == 0 or BUCKET not in table.schema.names:
        return None
    label = table.column(BUCKET)[0].as_py()
    hashes = [h for h, owner in split_owners.items() if owner != label]
    return pa.array(hashes, pa.int64()) if hashes else None


def _owned_spread(
    table: pa.Table,
    split_owners: Mapping[int, int],
    split_ways: Mapping[int, int],
    layout: WideLayout,
    plan: StepPlan,
) -> dict[tuple[Any, ...], int]:
    """The split keys this bucket owns, by join value, with their number of buckets."""
    if not split_ways or table.num_rows == 0 or BUCKET not in table.schema.names:
        return {}
    label = table.column(BUCKET)[0].as_py()
    spread = {}
    for key_hash, owner in split_owners.items():
        ways = split_ways.get(key_hash, 1)
        if owner != label or ways < 2:
            continue
        for key in _keys_of(table, pa.array([key_hash], pa.int64()), layout, plan, True):
            spread[key] = ways
    return spread


def _keys_of(
    table: pa.Table,
    hashes: pa.Array | None,
    layout: WideLayout,
    plan: StepPlan,
    stream_only: bool = False,
) -> set[tuple[Any, ...]]:
    """The join values of the rows whose key hash is in ``hashes``, as Algorithm 1 keys
    them (of stream rows only, when ``stream_only``)."""
    if hashes is None or not len(hashes):
        return set()
    rows = table.filter(pc.is_in(table.column(KEY_HASH), hashes))
    roles = rows.column(ROLE)
    stream = rows.filter(pc.is_in(roles, value_set=pa.array(STREAM_ROLES)))
    positions = tuple(range(len(layout.stream_keys)))
    keys = {
        join_value(row, positions)
        for row in _rows(stream, [stream_field(c) for c in layout.stream_keys])
    }
    if not stream_only:
        master = rows.filter(pc.invert(pc.is_in(roles, value_set=pa.array(STREAM_ROLES))))
        keys |= {plan.master_key_of(row) for row in _rows(master, layout.master_fields)}
    return keys


@dataclass(frozen=True)
class BucketStep:
    """Algorithm 1 over one bucket's rows: what ``applyInArrow`` calls per bucket (see
    :func:`bucket_step`), and :meth:`all_buckets` for a step whose rows the driver holds."""

    layout: WideLayout
    plan: StepPlan
    deltas: BucketDeltas
    top_keys: int = 0
    split_owners: Mapping[int, int] | None = None
    tracked: Sequence[int] | None = None
    sketch: SketchShape | None = None
    split_ways: Mapping[int, int] | None = None
    late: LateRule | None = None

    def __call__(self, table: pa.Table) -> pa.Table:
        return bucket_step(
            table,
            self.layout,
            self.plan,
            self.deltas,
            self.top_keys,
            self.split_owners,
            self.tracked,
            self.sketch,
            self.split_ways,
            self.late,
        )

    def all_buckets(self, keyed: pa.Table, partitions_asked: bool = False) -> pa.Table | None:
        """Every bucket's step at once, from the keyed rows of all buckets (with their
        ``_bucket`` labels and ``_key_hash``): the same rows as running :meth:`__call__`
        on each bucket's rows and concatenating, as a multiset. None outside the columnar
        scope (late rows, split keys, master changes, a join the columnar pass does not
        compare as the join does): the caller then runs the buckets one by one.

        Why it is the same: every decision of Algorithm 1 concerns one join value
        (``joins.ssbj.algorithm``), and without split keys all rows of a value are in one
        bucket, so one pass over the union decides as the buckets would. What is per
        bucket, the loads (:func:`key_loads`) and key sketches, is computed per label.

        ``partitions_asked``: the master partition rows are only those whose join value a
        tuple asks for (read so in the driver), so there are none to drop."""
        if KEY_HASH not in keyed.schema.names:
            return None
        shape = _columnar_layout(self.layout, self.deltas, self.split_owners, self.late)
        if shape is None or not supports(keyed, shape):
            return None
        _refuse_late_rows(keyed)
        # Hashes are per value, and a value is in one bucket: the asked hashes of all
        # buckets drop exactly the rows each bucket's own would.
        if not partitions_asked:
            keyed = unasked_partition_rows_dropped(keyed)
        schema = pa.schema(
            [*(f for f in keyed.schema if f.name not in (BUCKET, KEY_HASH)), *LOAD_FIELDS]
        )
        if keyed.num_rows == 0:
            return schema.empty_table()
        loads = key_loads_by_bucket(keyed, self.top_keys)
        tracked_values = None
        if self.tracked is not None:
            keys = _keys_of(keyed, pa.array(self.tracked, pa.int64()), self.layout, self.plan, True)
            tracked_values = pa.array([key[0] for key in keys if key[0] is not None])
        sketches = _sketch_rows(keyed, self.layout, self.sketch)
        table = keyed.drop_columns([BUCKET, KEY_HASH])
        encoded = columnar_result(table, shape, self.plan, schema, tracked_values)
        if encoded is None:  # pragma: no cover - supports() checked the same scope above
            return None
        enc = _Encoder(schema)
        enc.add(KEY_LOAD, loads.num_rows, {n: loads.column(n) for n in loads.column_names})
        labels = [label for label, _ in sketches]
        enc.add(KEY_SKETCH, len(sketches), {BUCKET: labels, SKETCH: [s for _, s in sketches]})
        return pa.concat_tables([encoded, enc.table()])


def _sketch_rows(
    table: pa.Table, layout: WideLayout, shape: SketchShape | None
) -> list[tuple[int, bytes]]:
    """(bucket label, its :func:`new_key_sketch` as JSON) of every bucket of ``table``."""
    if shape is None:
        return []
    labels = pc.unique(table.column(BUCKET)).to_pylist()
    new = table.filter(pc.equal(table.column(ROLE), NEW))
    found = []
    for label in sorted(labels):
        rows = new.filter(pc.equal(new.column(BUCKET), label))
        sketch = new_key_sketch(rows, layout, shape)
        found.append((label, _sketch_json(sketch)))
    return found


def _sketch_json(sketch: ASketch) -> bytes:
    """A bucket's key sketch as its ``key_sketch`` row holds it."""
    return json.dumps(sketch.to_dict(), separators=(",", ":")).encode()


def bucket_function(
    layout: WideLayout,
    plan: StepPlan,
    deltas: BucketDeltas,
    top_keys: int = 0,
    split_owners: Mapping[int, int] | None = None,
    tracked: Sequence[int] | None = None,
    sketch: SketchShape | None = None,
    split_ways: Mapping[int, int] | None = None,
    late: LateRule | None = None,
) -> BucketStep:
    """The function ``applyInArrow`` calls per bucket (see :func:`bucket_step`)."""
    return BucketStep(
        layout, plan, deltas, top_keys, split_owners, tracked, sketch, split_ways, late
    )
