"""One key bucket of the SSBJ operator as Arrow: decode its rows, run Algorithm 1, encode.

A step's input is one wide table: every row carries a ``_role`` saying what it is (a new
stream tuple, a pending tuple, a cache row, a master partition row, ...) and the columns of
that role; the others are null (``joins.ssbj.roles``). The output has the same columns:
the enriched rows, the bucket's new state and its counters. This module depends on pyarrow
only; ``joins.ssbj.step`` builds the table with Spark and calls :func:`bucket_step` from
``groupBy(bucket).applyInArrow``.

This module holds the step over one bucket (and over all buckets at once, in the columnar
pass's scope) and what a bucket's key hashes decide: the partition rows no tuple asks for,
split and tracked keys, the key sketch of its new tuples, and each bucket's load and
heaviest keys (:func:`key_loads`). Decoding the rows is ``joins.ssbj.bucket_decode``,
encoding the result ``joins.ssbj.bucket_encode``; key routing between buckets is
``joins.skew.key_routing``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.rows import TableOfParts
from joins.skew.asketch import ASketch, SketchShape
from joins.ssbj.algorithm import StepPlan, join_value, run_step
from joins.ssbj.bucket_decode import (
    BucketDeltas,
    BucketRoles,
    WideLayout,
    decode_state,
    master_delta,
    partition_rows,
    row_tuples,
)
from joins.ssbj.bucket_encode import LateRows, encode_result
from joins.ssbj.columnar import columnar_result
from joins.ssbj.columnar_tables import ColumnarLayout, supports
from joins.ssbj.late import LateRule, sort_late_rows
from joins.ssbj.roles import (
    ASKING_ROLES,
    BUCKET,
    CACHE_CHANGE,
    KEY_HASH,
    KEY_LOAD,
    KEY_SKETCH,
    LATE,
    LOADED_ROLES,
    NEW,
    PARTITION,
    PROBES,
    PROBING_ROLES,
    RETURNING,
    ROLE,
    SKETCH,
    STORED,
    STREAM_ROLES,
    SWITCH_CHANGE,
    stream_field,
)

LOAD_FIELDS = (
    pa.field(BUCKET, pa.int32()),
    pa.field(KEY_HASH, pa.int64()),
    pa.field(STORED, pa.int64()),
    pa.field(PROBES, pa.int64()),
    pa.field(SKETCH, pa.binary()),
)


def bucket_step(table: pa.Table, step: BucketStep, columnar: bool = True) -> pa.Table:
    """Run ``step`` for the rows of one bucket (any role mix) and encode what it yields.

    ``step.plan`` must locate join values as this module decodes them: ``stream_key`` is
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
    layout, plan, deltas, late = step.layout, step.plan, step.deltas, step.late
    split_owners, split_ways, tracked = step.split_owners, step.split_ways, step.tracked
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
    replicated = replicated_hashes(table, split_owners or {})
    loads = key_loads(table, step.top_keys, replicated) if KEY_HASH in names else None
    replica_keys = keys_of(table, replicated, layout, plan)
    tracked_keys = None
    if tracked is not None:
        tracked_keys = frozenset(
            keys_of(table, pa.array(tracked, pa.int64()), layout, plan, stream_only=True)
        )
    partial = new_key_sketch(table, layout, step.sketch) if step.sketch is not None else None
    spread = owned_spread(table, split_owners or {}, split_ways or {}, layout, plan)
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
    roles = BucketRoles(table)
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
        partition_rows(roles, layout, wanted),
        cache_delta=master_delta(roles, CACHE_CHANGE, deltas.cache, layout),
        switch_delta=master_delta(roles, SWITCH_CHANGE, deltas.switch, layout),
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
    enc = TableOfParts(schema, ROLE)
    enc.add(KEY_LOAD, loads.num_rows, {name: loads.column(name) for name in loads.column_names})
    if partial is not None:
        enc.add(
            KEY_SKETCH,
            1,
            {
                BUCKET: [loads.column(BUCKET)[0].as_py()],
                SKETCH: [sketch_json(partial)],
            },
        )
    return pa.concat_tables([encoded, enc.table()])


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
        return bucket_step(table, self)

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
            keys = keys_of(keyed, pa.array(self.tracked, pa.int64()), self.layout, self.plan, True)
            tracked_values = pa.array([key[0] for key in keys if key[0] is not None])
        sketches = sketch_rows(keyed, self.layout, self.sketch)
        table = keyed.drop_columns([BUCKET, KEY_HASH])
        encoded = columnar_result(table, shape, self.plan, schema, tracked_values)
        if encoded is None:  # pragma: no cover - supports() checked the same scope above
            return None
        enc = TableOfParts(schema, ROLE)
        enc.add(KEY_LOAD, loads.num_rows, {n: loads.column(n) for n in loads.column_names})
        labels = [label for label, _ in sketches]
        enc.add(KEY_SKETCH, len(sketches), {BUCKET: labels, SKETCH: [s for _, s in sketches]})
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


def replicated_hashes(table: pa.Table, split_owners: Mapping[int, int]) -> pa.Array | None:
    """The hashes of the split keys this bucket holds a replica of (not their owner)."""
    if not split_owners or table.num_rows == 0 or BUCKET not in table.schema.names:
        return None
    label = table.column(BUCKET)[0].as_py()
    hashes = [h for h, owner in split_owners.items() if owner != label]
    return pa.array(hashes, pa.int64()) if hashes else None


def owned_spread(
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
        for key in keys_of(table, pa.array([key_hash], pa.int64()), layout, plan, True):
            spread[key] = ways
    return spread


def keys_of(
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
        for row in row_tuples(stream, [stream_field(c) for c in layout.stream_keys])
    }
    if not stream_only:
        master = rows.filter(pc.invert(pc.is_in(roles, value_set=pa.array(STREAM_ROLES))))
        keys |= {plan.master_key_of(row) for row in row_tuples(master, layout.master_fields)}
    return keys


def sketch_rows(
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
        found.append((label, sketch_json(sketch)))
    return found


def sketch_json(sketch: ASketch) -> bytes:
    """A bucket's key sketch as its ``key_sketch`` row holds it."""
    return json.dumps(sketch.to_dict(), separators=(",", ":")).encode()


def sketch_of_json(stored: bytes) -> ASketch:
    """A bucket's key sketch read back from its ``key_sketch`` row (:func:`sketch_json`)."""
    return ASketch.from_dict(json.loads(stored))


LOAD_SCHEMA = pa.schema(
    [
        pa.field(BUCKET, pa.int32()),
        pa.field(KEY_HASH, pa.int64()),
        pa.field(STORED, pa.int64()),
        pa.field(PROBES, pa.int64()),
    ]
)


def key_loads(table: pa.Table, top: int, replicated: pa.Array | None = None) -> pa.Table:
    """One bucket's load rows (its rows carry one ``_bucket`` label): its ``top``
    heaviest keys, then its totals. The copies of ``replicated`` keys' rows (split keys
    this bucket is a replica of) are not stored here.

    FastJoin (seeds/fastjoin_skew_aware_stream_join.txt, Eq. 3-4 and Eq. 8): a bucket's
    load is ``|R_i|``, the rows it holds (:data:`LOADED_ROLES`: H_S and H_R), and
    ``phi_si``, the rows that probe it this step (:data:`PROBING_ROLES`: the new tuples
    and the master partition). Its keys are ranked by what moving one would take off the
    bucket, Eq. 8 on this side alone: ``gain = |R_i|·phi_sik + phi_si·|R_ik|``,
    descending, ties by key hash ascending (a total order, so a rerun ranks alike).

    Invariants: only keys with some load are ranked (a key with only counters or s_B
    rows in a bucket weighs nothing there); every bucket label with a row of any role
    gets a totals row (null hash); :func:`key_loads_by_bucket` over several buckets' rows
    (no split keys) gives the rows of :func:`key_loads` over each bucket, concatenated in
    label order. A row is ``(bucket label, key hash, stored, probes)``."""
    label = table.column(BUCKET)[0].as_py() if table.num_rows else None
    hashes, _, stored, probes = _per_key(table, replicated)
    return _load_rows(label, hashes, stored, probes, top)


def key_loads_by_bucket(table: pa.Table, top: int) -> pa.Table:
    """:func:`key_loads` of every bucket of ``table`` (rows of several ``_bucket`` labels,
    no split keys, so a key hash is in one bucket) in one pass."""
    if table.num_rows == 0:
        return LOAD_SCHEMA.empty_table()
    hashes, labels, stored, probes = _per_key(table, None)
    parts = []
    for label in sorted(pc.unique(table.column(BUCKET)).to_pylist()):
        mine = labels == label
        parts.append(_load_rows(label, hashes[mine], stored[mine], probes[mine], top))
    return pa.concat_tables(parts)


def _per_key(
    table: pa.Table, replicated: pa.Array | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(hash, bucket label, stored, probes) of every key with some load, one per hash, in
    no particular order. Only the weighed rows are grouped: a step's counters and s_B are
    most of its rows in some cycles, and weigh nothing. The group-by hashes the weighed
    hashes as one array (Arrow's ``dictionary_encode``): H_S is most of them, and numpy's
    sorting ``unique`` over them was most of a step's key loads (BENCHMARKS.md, section 3)."""
    roles = table.column(ROLE)
    loaded = pc.is_in(roles, value_set=pa.array(LOADED_ROLES))
    probing = pc.is_in(roles, value_set=pa.array(PROBING_ROLES))
    weighed = _numpy(pc.or_(loaded, probing))
    if replicated is not None and len(replicated):
        loaded = pc.and_(loaded, pc.invert(pc.is_in(table.column(KEY_HASH), replicated)))
    hashes = _numpy(table.column(KEY_HASH))[weighed]
    labels = _numpy(table.column(BUCKET))[weighed]
    encoded = pa.array(hashes).dictionary_encode()
    keys = encoded.dictionary.to_numpy()
    inverse = encoded.indices.to_numpy()
    # A key's rows are in one bucket: any of them gives its label (``return_index``
    # would sort stably, 5x slower).
    key_labels = np.empty(len(keys), labels.dtype)
    key_labels[inverse] = labels
    # Counts as float weights are exact below 2**53 rows.
    stored = np.bincount(inverse, _numpy(loaded)[weighed], len(keys)).astype(np.int64)
    probes = np.bincount(inverse, _numpy(probing)[weighed], len(keys)).astype(np.int64)
    some = (stored > 0) | (probes > 0)
    return keys[some], key_labels[some], stored[some], probes[some]


def _numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(column.to_numpy(zero_copy_only=False))


def heaviest(gain: np.ndarray, hashes: np.ndarray, top: int) -> np.ndarray:
    """Positions of the ``top`` first keys by (gain descending, hash ascending), in that
    order: the keys above the ``top``-th gain, and of those tied at it the smallest
    hashes, without sorting every key."""
    n = len(gain)
    count = min(top, n)
    if count <= 0:
        return np.zeros(0, np.int64)
    if count < n:
        threshold = np.partition(gain, n - count)[n - count]  # the top-th largest gain
        above = np.flatnonzero(gain > threshold)
        tied = np.flatnonzero(gain == threshold)
        tied = tied[np.argsort(hashes[tied], kind="stable")[: count - len(above)]]
        chosen = np.concatenate([above, tied])
    else:
        chosen = np.arange(n)
    return chosen[np.lexsort((hashes[chosen], -gain[chosen]))]


def _load_rows(
    label: int | None, hashes: np.ndarray, stored: np.ndarray, probes: np.ndarray, top: int
) -> pa.Table:
    """A bucket's load rows: its ``top`` heaviest keys by Eq. 8's gain, then the totals."""
    total_stored = int(stored.sum())
    total_probes = int(probes.sum())
    gain = probes * total_stored + stored * total_probes
    order = heaviest(gain, hashes, top)
    n = len(order) + 1
    return pa.table(
        {
            BUCKET: pa.repeat(pa.scalar(label, pa.int32()), n),
            KEY_HASH: pa.array([*hashes[order].tolist(), None], pa.int64()),
            STORED: pa.array([*stored[order].tolist(), total_stored], pa.int64()),
            PROBES: pa.array([*probes[order].tolist(), total_probes], pa.int64()),
        },
        schema=LOAD_SCHEMA,
    )
