"""One loop iteration of SSBJ's Algorithm 1 for one bucket, on Arrow columns.

The same step as ``joins.ssbj.algorithm.run_step`` (the reference model, which the
property tests compare it with), without decoding a single tuple into Python: each phase
is a hash join, a membership test or a group-by over the bucket's role tables, so a step
costs its data in Arrow's C++ kernels rather than a Python loop per tuple.

- cache phase (lines 15–23): new tuples join H_R on the join value; a hit counts
  f_count, a miss enters H_S pinned to the plan's version;
- switching (line 33): per value pending in H_S, ``|H_S(j)|·v_S > s_f·s_count(j)·v_R``;
- disk phase (lines 24–27): H_S joins the partition rows on (value, pinned version);
- instrumentation (lines 28–29): s_count and the partitions observed, per pending value;
- s_B collection (line 34), the chunk leaving H_S (lines 39–41) and, at a cycle's
  start, the move of s_B into H_R (lines 9–10) and the eviction pass (lines 42–49).

Scope: one join column of an integer or string type (their Arrow equality is the join's;
floating values need the reference model's NaN rule), no master changes to apply this
step, no split keys and no late rows; ``columnar_result`` returns None for anything else
and the caller runs the reference model.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.rows import rows_where
from joins.ssbj.algorithm import StepCounts, StepPlan
from joins.ssbj.cache.rcycle import CycleState
from joins.ssbj.columnar_tables import (
    KEY,
    ColumnarLayout,
    Counters,
    constant,
    counts_of,
    distinct,
    lookup,
    member_of,
    role_rows,
    row_numbers,
    supports,
    value_counts,
    with_column,
    with_key,
)
from joins.ssbj.roles import (
    CACHE,
    COUNTER,
    EMPTY,
    ENTRY_STEP,
    HITS,
    LATE_SINCE,
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
    ROLE,
    SWITCH,
    VALUE,
    VERSION,
)

_POS = "__pos"  # a stream tuple's row in its role table


@dataclass
class _Bucket:
    """The role tables of one bucket's step, as the phases of Algorithm 1 advance them.
    Local to one :func:`columnar_result` call: each phase below reads and replaces them."""

    key_type: pa.DataType
    new: pa.Table
    pending: pa.Table
    cache: pa.Table | None
    counters: Counters
    marked: pa.Array
    switch: pa.Table
    parts: pa.Table
    counts: StepCounts
    outputs: list[pa.Table]
    cached_keys: pa.ChunkedArray | None = None


def columnar_result(
    table: pa.Table,
    layout: ColumnarLayout,
    plan: StepPlan,
    schema: pa.Schema,
    tracked: pa.Array | None = None,
) -> pa.Table | None:
    """The encoded result of one step of the bucket whose rows are ``table`` (roles new,
    pending, cache, counter, marked, switch and partition; no change rows), as
    ``joins.ssbj.buckets.encode_result(run_step(...))`` lays it out; None outside this
    module's scope (see the module docstring). ``tracked``: the only values instrumented
    and weighed for switching (``run_step``'s ``tracked``); None counts every value."""
    if not supports(table, layout):
        return None
    key_type = table.schema.field(layout.master_key).type
    if tracked is not None:
        tracked = tracked.cast(key_type)
    position = plan.position
    b = _decode(table, layout, plan, key_type)
    if plan.use_cache and position.starts_cycle:
        _start_cycle(b, layout, plan)
    _cache_phase(b, layout, plan)
    if plan.use_cache and position.starts_cycle and position.state is CycleState.SWITCHING:
        _choose_switches(b, plan, tracked)
    live = _disk_phase(b, layout, plan)
    if plan.use_cache and position.state is CycleState.INCREMENTING:
        _count_master_rows(b, live, plan, tracked)
    if (
        plan.use_cache
        and position.state is CycleState.SWITCHING
        and plan.switch_version is not None
    ):
        # One mask, so that only the marked values' rows are copied, not the partition's.
        collected = b.parts.filter(
            pc.and_(
                pc.equal(b.parts.column(VERSION), plan.switch_version),
                member_of(b.parts.column(KEY), b.marked),
            )
        )
        b.switch = pa.concat_tables(
            [b.switch, collected.select(b.switch.schema.names).cast(b.switch.schema)]
        )
    return _expire_and_encode(b, layout, plan, schema)


def _decode(
    table: pa.Table, layout: ColumnarLayout, plan: StepPlan, key_type: pa.DataType
) -> _Bucket:
    """The bucket's role tables, each with the join value as ``KEY``: H_R without the
    empty-entry markers its rows make moot, one counter row and one mark per value."""
    new = with_key(role_rows(table, NEW), layout.stream_key, key_type)
    pending = with_key(role_rows(table, PENDING), layout.stream_key, key_type)
    pinned = pending.column(PINNED_VERSION)
    if (
        pending.num_rows
        and not pc.all(
            pc.is_in(pinned, value_set=pa.array(sorted(plan.partition_versions), pa.int64()))
        ).as_py()
    ):
        raise ValueError(
            f"step {plan.step}: a pending tuple is pinned to a master version whose "
            f"partition the plan does not hold ({sorted(plan.partition_versions)})"
        )
    cache = (
        with_key(role_rows(table, CACHE), layout.master_key, key_type) if plan.use_cache else None
    )
    if cache is not None and cache.num_rows:
        # A value's rows make its entry; an empty-entry marker beside them means nothing.
        # H_R is large (at SF30 most of the step's memory): only its key column is
        # filtered, and the entries kept are usually all of it (one run: a slice). Most
        # steps hold no empty entry at all, and skip the filter.
        empty = pc.fill_null(cache.column(EMPTY), False)
        if pc.any(empty).as_py():
            stored = distinct(pc.filter(cache.column(KEY), pc.invert(empty)))
            cache = rows_where(
                cache, pc.invert(pc.and_(empty, member_of(cache.column(KEY), stored)))
            )
    counter_rows = role_rows(table, COUNTER)
    counters = Counters(
        pa.table(
            {
                KEY: counter_rows.column(layout.master_key).cast(key_type),
                HITS: counter_rows.column(HITS).cast(pa.int64()),
                MASTER_ROWS: counter_rows.column(MASTER_ROWS).cast(pa.int64()),
                OBSERVED: counter_rows.column(OBSERVED).cast(pa.int64()),
            }
        )
    )
    if not plan.one_row_per_value and pc.count_distinct(
        counters.table.column(KEY), mode="all"
    ).as_py() < len(counters):
        # One row per value: a split key's replicas handed their counters to its owner
        # (hits add up, master rows were counted over the same partitions), as
        # ``decode_state`` does. The counters this pass wrote are one per value already.
        counters = Counters(
            counters.table.group_by(KEY)
            .aggregate([(HITS, "sum"), (MASTER_ROWS, "max"), (OBSERVED, "max")])
            .select([KEY, f"{HITS}_sum", f"{MASTER_ROWS}_max", f"{OBSERVED}_max"])
            .rename_columns([KEY, HITS, MASTER_ROWS, OBSERVED])
        )
    marked = role_rows(table, MARKED).column(layout.master_key).cast(key_type).combine_chunks()
    if not plan.one_row_per_value:
        marked = distinct(marked)
    switch = with_key(role_rows(table, SWITCH), layout.master_key, key_type)
    parts = with_key(role_rows(table, PARTITION), layout.master_key, key_type)
    parts = rows_where(parts, pc.is_valid(parts.column(KEY)))
    return _Bucket(key_type, new, pending, cache, counters, marked, switch, parts, StepCounts(), [])


def _start_cycle(b: _Bucket, layout: ColumnarLayout, plan: StepPlan) -> None:
    """A cycle's first step: s_B into H_R at a phase-out (lines 9–10), the eviction pass
    (lines 42–49), s_count reset at an incrementing cycle."""
    position = plan.position
    assert b.cache is not None
    if position.state is CycleState.PHASE_OUT and len(b.marked):
        # Lines 9–10: s_B moves into H_R whole; a marked value without rows is an
        # empty entry (the negative cache).
        kept = b.cache.filter(pc.invert(member_of(b.cache.column(KEY), b.marked)))
        moved = with_column(
            b.switch, EMPTY, pa.repeat(pa.scalar(False, pa.bool_()), b.switch.num_rows)
        )
        with_rows = distinct(b.switch.column(KEY))
        bare = b.marked.filter(pc.invert(member_of(b.marked, with_rows)))
        # s_B was collected a chunk per step: H_R takes it as one.
        b.cache = pa.concat_tables(
            [
                kept,
                moved.cast(b.cache.schema).combine_chunks(),
                _key_rows(bare, b.cache.schema, layout, True),
            ]
        )
        b.marked = pa.array([], b.key_type)
        b.switch = b.switch.slice(0, 0)
    if position.evicts:
        b.cache = _evicted(b.cache, b.counters, plan, position.eviction_cycles)
        b.counters = b.counters.with_columns({HITS: np.zeros(b.counters.table.num_rows, np.int64)})
    if position.state is CycleState.INCREMENTING:
        b.counters = b.counters.without_s_count()
    b.counters = b.counters.nonzero()


def _cache_phase(b: _Bucket, layout: ColumnarLayout, plan: StepPlan) -> None:
    """Lines 15–23: new tuples probe H_R; a hit is answered (and counted in f_count), a
    miss enters H_S pinned to the plan's version."""
    key_type, new, cache, counts = b.key_type, b.new, b.cache, b.counts
    counts.tuples_in = new.num_rows
    new = new.append_column(_POS, pa.array(np.arange(new.num_rows, dtype=np.int64)))
    if plan.use_cache:
        assert cache is not None
        b.cached_keys = cache.column(KEY)
        hit = member_of(new.column(KEY), b.cached_keys)
    else:
        b.cached_keys = pa.chunked_array([], key_type)
        hit = pa.chunked_array([pa.array(np.zeros(new.num_rows, bool))])
    misses = new.filter(pc.invert(hit))
    counts.cache_hits = new.num_rows - misses.num_rows
    counts.entered_pending = misses.num_rows
    if counts.cache_hits:
        assert cache is not None
        # Only the hits' keys are copied: the join takes their rows from ``new`` by
        # position, and the entries' rows from H_R (copying all of H_R to drop its empty
        # entries cost 75 ms a step at SF30).
        per_key = value_counts(pc.filter(new.column(KEY), hit), key_type)
        hit_keys = per_key.column(KEY).combine_chunks()
        b.counters = b.counters.add(key_type, hit_keys, {HITS: counts_of(per_key)})
        with_rows = pc.and_(
            pc.invert(pc.fill_null(cache.column(EMPTY), False)),
            member_of(cache.column(KEY), hit_keys),
        )
        matched = _join(new, cache, layout, on_version=False, kept=(hit, with_rows))
        version = plan.master_version
        b.outputs.append(_versioned(matched, constant(version, pa.int64(), matched.num_rows)))
        if plan.left_join:
            entries = distinct(pc.filter(cache.column(KEY), with_rows))
            empty = new.filter(pc.and_(hit, pc.invert(member_of(new.column(KEY), entries))))
            counts.cache_hits_unmatched = empty.num_rows
            b.outputs.append(_out_unmatched(empty, layout))
    entered = misses.drop_columns([_POS])
    n = entered.num_rows
    entered = with_column(entered, ENTRY_STEP, constant(plan.step, pa.int64(), n))
    entered = with_column(entered, PINNED_VERSION, constant(plan.master_version, pa.int64(), n))
    entered = with_column(entered, MATCHED, constant(False, pa.bool_(), n))
    pending = pa.concat_tables(
        [b.pending, entered.select(b.pending.schema.names).cast(b.pending.schema)]
    )
    b.pending = pending.append_column(_POS, pa.array(np.arange(pending.num_rows, dtype=np.int64)))


def _choose_switches(b: _Bucket, plan: StepPlan, tracked: pa.Array | None) -> None:
    """Line 33, at a switching cycle's first step: mark each value pending in H_S (and
    neither cached nor marked) whose tuples there outweigh its master rows."""
    position, counters = plan.position, b.counters
    assert b.cache is not None and b.cached_keys is not None
    waiting = value_counts(b.pending.column(KEY), b.key_type)
    if tracked is not None:
        waiting = waiting.filter(member_of(waiting.column(KEY), tracked))
    candidates = waiting.filter(
        pc.invert(
            pc.or_(
                member_of(waiting.column(KEY), b.cached_keys),
                member_of(waiting.column(KEY), b.marked),
            )
        )
    )
    keys = candidates.column(KEY).combine_chunks()
    tuples = counts_of(candidates)
    counted = member_of(keys, counters.table.column(KEY)).to_numpy(zero_copy_only=False)
    master_rows = lookup(keys, counters.table, MASTER_ROWS)
    observed = lookup(keys, counters.table, OBSERVED)
    if plan.estimator == "extrapolated":
        # ``estimated_master_rows``: known when some row was counted, or when every
        # partition was seen and none was (m = 0).
        usable = counted & (observed > 0) & ((master_rows > 0) | (observed >= position.partitions))
        estimate = np.where(
            usable, master_rows * position.partitions / np.maximum(observed, 1), 0.0
        )
    else:
        usable = np.ones(len(keys), bool)
        estimate = master_rows.astype(float)
    sizes, factor = plan.sizes, plan.switch_factor
    switch_now = (
        usable
        & (tuples > 0)
        & (tuples * sizes.stream_bytes > factor * (estimate * sizes.master_bytes))
    )
    if switch_now.any():
        b.marked = pa.concat_arrays([b.marked, keys.filter(pa.array(switch_now))])
    # Line 33 was s_count's last reader until the next incrementing cycle: it is
    # reset now (``joins.ssbj.algorithm``), and only values with hits keep counters.
    b.counters = counters.without_s_count()


def _disk_phase(b: _Bucket, layout: ColumnarLayout, plan: StepPlan) -> pa.Table:
    """Lines 24–27: H_S meets the partition's rows on (value, pinned version); a left
    join flags the tuples that matched. Returns H_S's tuples with a value."""
    pending = b.pending
    live = rows_where(pending, pc.is_valid(pending.column(KEY)))
    met = _join(live, b.parts, layout, on_version=True)
    b.outputs.append(_versioned(met, met.column(PINNED_VERSION)))
    if plan.left_join:  # the flag is a left join's (``joins.ssbj.algorithm``)
        matched_now = distinct(met.column(_POS)) if met.num_rows else pa.array([], pa.int64())
        was = pc.fill_null(pending.column(MATCHED), False)
        b.pending = with_column(
            pending, MATCHED, pc.or_(was, pc.is_in(pending.column(_POS), value_set=matched_now))
        )
    return live


def _count_master_rows(
    b: _Bucket, live: pa.Table, plan: StepPlan, tracked: pa.Array | None
) -> None:
    """Lines 28–29: s_count of every pending value over the current partition.

    Only the key column of the partition's rows is counted: filtering the whole partition
    copied every column of 1.5M rows a step at SF30 (the partition is one version,
    usually: then the rows are one run and nothing is copied)."""
    parts = b.parts
    current = rows_where(parts.select([KEY]), pc.equal(parts.column(VERSION), plan.master_version))
    values = distinct(live.column(KEY))
    if tracked is not None:
        values = values.filter(member_of(values, tracked))
    rows_per_key = value_counts(current.column(KEY), b.key_type)
    b.counters = b.counters.add(
        b.key_type,
        values,
        {
            MASTER_ROWS: lookup(values, rows_per_key, "n"),
            OBSERVED: np.ones(len(values), np.int64),
        },
    )


def _expire_and_encode(
    b: _Bucket, layout: ColumnarLayout, plan: StepPlan, schema: pa.Schema
) -> pa.Table:
    """Lines 39–41: the chunk that has now met all k partitions leaves H_S (a left join
    emits its unmatched tuples); then the step's output and state, encoded."""
    pending, counts = b.pending, b.counts
    expiring = plan.expiring_entry_step()
    leaving = (
        pc.fill_null(pc.equal(pending.column(ENTRY_STEP), expiring), False)
        if expiring is not None
        else pa.chunked_array([pa.array(np.zeros(pending.num_rows, bool))])
    )
    # H_S is in entry order: the expiring chunk is its first run, the rest the second.
    gone = rows_where(pending, leaving)
    counts.expired = gone.num_rows
    if plan.left_join:
        b.outputs.append(_out_unmatched(gone.filter(pc.invert(gone.column(MATCHED))), layout))
    kept = rows_where(pending, pc.invert(leaving))
    out = (
        pa.concat_tables(
            [
                o.select(list(_out_columns(layout))).cast(_out_schema(schema, layout))
                for o in b.outputs
            ]
        )
        if b.outputs
        else None
    )
    counts.output_rows = 0 if out is None else out.num_rows
    counts.pending_rows = kept.num_rows
    counts.counter_rows = b.counters.table.num_rows
    counts.switch_rows = b.switch.num_rows
    if plan.use_cache:
        assert b.cache is not None
        counts.cache_rows = b.cache.num_rows
    return _encode(schema, layout, out, kept, b.cache, b.counters, b.marked, b.switch, counts)


def _join(
    tuples: pa.Table,
    master: pa.Table,
    layout: ColumnarLayout,
    on_version: bool,
    kept: tuple[pa.ChunkedArray, pa.ChunkedArray] | None = None,
) -> pa.Table:
    """Every (tuple, master row) pair with equal join values (and, ``on_version``, the
    row of the tuple's pinned version): the tuple's stream columns and position, the
    row's master columns. ``kept``: masks of the tuples and of the master rows that
    take part (the others' rows are not copied)."""
    # Only the keys and row numbers go through the hash join (Arrow's join cannot carry
    # nested columns, and need not copy any): the rows are taken by number after it.
    keys = [KEY, PINNED_VERSION] if on_version else [KEY]
    versions = [VERSION] if on_version else []
    left = tuples.select(keys).append_column("__left", row_numbers(tuples.num_rows))
    right = master.select([KEY, *versions]).rename_columns(["__rkey", *versions])
    right = right.append_column("__right", row_numbers(master.num_rows))
    if kept is not None:
        left, right = left.filter(kept[0]), right.filter(kept[1])
    if left.num_rows and right.num_rows:
        pairs = left.join(right, keys=keys, right_keys=["__rkey", *versions], join_type="inner")
        lefts, rights = pairs.column("__left"), pairs.column("__right")
    else:
        lefts = rights = pa.chunked_array([], pa.int64())
    carried = tuples.select([*layout.stream_fields, LATE_SINCE, _POS, *keys]).take(lefts)
    rows = master.select(list(layout.master_fields)).take(rights)
    for name in layout.master_fields:
        carried = carried.append_column(name, rows.column(name))
    return carried


def _out_columns(layout: ColumnarLayout) -> tuple[str, ...]:
    return (*layout.stream_fields, LATE_SINCE, *layout.master_fields, "__version")


def _out_schema(schema: pa.Schema, layout: ColumnarLayout) -> pa.Schema:
    return pa.schema(
        [
            *(schema.field(c) for c in (*layout.stream_fields, LATE_SINCE)),
            *(schema.field(c) for c in layout.master_fields),
            pa.field("__version", pa.int64()),
        ]
    )


def _versioned(joined: pa.Table, versions: pa.Array | pa.ChunkedArray) -> pa.Table:
    return joined.append_column("__version", versions)


def _out_unmatched(tuples: pa.Table, layout: ColumnarLayout) -> pa.Table:
    rows = tuples.select([*layout.stream_fields, LATE_SINCE])
    for c in layout.master_fields:
        rows = rows.append_column(c, pa.nulls(rows.num_rows))
    return rows.append_column("__version", pa.nulls(rows.num_rows, pa.int64()))


def _key_rows(keys: pa.Array, schema: pa.Schema, layout: ColumnarLayout, empty: bool) -> pa.Table:
    columns = {}
    for f in schema:
        if f.name in (layout.master_key, KEY):
            columns[f.name] = keys.cast(f.type)
        elif f.name == EMPTY:
            columns[f.name] = pa.repeat(pa.scalar(empty, pa.bool_()), len(keys))
        elif f.name == ROLE:
            columns[f.name] = pa.repeat(pa.scalar(CACHE, f.type), len(keys))
        else:
            columns[f.name] = pa.nulls(len(keys), f.type)
    return pa.table(columns, schema=schema)


def _evicted(cache: pa.Table, counters: Counters, plan: StepPlan, cycles: int) -> pa.Table:
    """Lines 42–49: drop every value with |H_R(j)|·v_R >= s_f·f_count(j)/E·v_S."""
    if cache.num_rows == 0:
        return cache
    stored = pc.cast(pc.invert(pc.fill_null(cache.column(EMPTY), False)), pa.int64())
    per_key = (
        pa.table({KEY: cache.column(KEY), "n": stored})
        .group_by(KEY)
        .aggregate([("n", "sum")])
        .select([KEY, "n_sum"])
        .rename_columns([KEY, "n"])
    )
    keys = per_key.column(KEY).combine_chunks()
    rows = counts_of(per_key)
    hits = lookup(keys, counters.table, HITS)
    sizes = plan.sizes
    evict = rows * sizes.master_bytes >= plan.switch_factor * (hits / cycles * sizes.stream_bytes)
    dropped = keys.filter(pa.array(evict))
    return cache.filter(pc.invert(member_of(cache.column(KEY), dropped)))


def _encode(
    schema: pa.Schema,
    layout: ColumnarLayout,
    out: pa.Table | None,
    kept: pa.Table,
    cache: pa.Table | None,
    counters: Counters,
    marked: pa.Array,
    switch: pa.Table,
    counts: StepCounts,
) -> pa.Table:
    parts: list[pa.Table] = []
    # A role's rows leave most of the wide table's columns null: each type's null column
    # is made once, as long as the largest role, and sliced (zero-copy) for each column.
    # One array per column cost an incrementing step 3-4 ms: 20 null columns of 48k
    # counters, each with its own zeroed buffers.
    longest = max(
        0 if out is None else out.num_rows,
        kept.num_rows,
        0 if cache is None else cache.num_rows,
        counters.table.num_rows,
        len(marked),
        switch.num_rows,
    )
    nulls: dict[pa.DataType, pa.Array] = {}

    def null_column(kind: pa.DataType, n: int) -> pa.Array:
        if kind not in nulls or len(nulls[kind]) < n:  # the metric rows may be more
            nulls[kind] = pa.nulls(max(longest, n), kind)
        return nulls[kind].slice(0, n)

    def add(role: str, n: int, columns: dict[str, pa.Array | pa.ChunkedArray]) -> None:
        if n == 0:
            return
        arrays = []
        for f in schema:
            if f.name == ROLE:
                arrays.append(pa.repeat(pa.scalar(role, f.type), n))
            elif f.name in columns:
                column = columns[f.name]  # a cast to its own type would copy it
                arrays.append(column if column.type == f.type else column.cast(f.type))
            else:
                arrays.append(null_column(f.type, n))
        parts.append(pa.Table.from_arrays(arrays, schema=schema))

    if out is not None:
        carried = (*layout.stream_fields, LATE_SINCE, *layout.master_fields)
        add(
            OUT,
            out.num_rows,
            {c: out.column(c) for c in carried} | {VERSION: out.column("__version")},
        )
    add(
        PENDING,
        kept.num_rows,
        {
            c: kept.column(c)
            for c in (*layout.stream_fields, ENTRY_STEP, PINNED_VERSION, MATCHED, LATE_SINCE)
        },
    )
    if cache is not None:
        add(CACHE, cache.num_rows, {c: cache.column(c) for c in (*layout.master_fields, EMPTY)})
    ct = counters.table
    add(
        COUNTER,
        ct.num_rows,
        {
            layout.master_key: ct.column(KEY),
            HITS: ct.column(HITS),
            MASTER_ROWS: ct.column(MASTER_ROWS),
            OBSERVED: ct.column(OBSERVED),
        },
    )
    add(MARKED, len(marked), {layout.master_key: marked})
    add(SWITCH, switch.num_rows, {c: switch.column(c) for c in layout.master_fields})
    metrics = [(f.name, int(getattr(counts, f.name))) for f in fields(StepCounts)]
    add(
        METRIC_ROLE,
        len(metrics),
        {
            METRIC: pa.array([n for n, _ in metrics]),
            VALUE: pa.array([v for _, v in metrics], pa.int64()),
        },
    )
    return pa.concat_tables(parts) if parts else schema.empty_table()
