"""A bucket's key hashes: the partition rows no tuple asks for, split and tracked keys'
join values, and the key sketch of its new tuples.

These read the ``_key_hash`` column a step's rows carry beside their bucket label
(``joins.ssbj.step``); key routing between buckets is ``joins.skew.key_routing``. pyarrow
only, no Spark.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from joins.skew.asketch import ASketch, SketchShape
from joins.ssbj.algorithm import StepPlan, join_value
from joins.ssbj.bucket_decode import WideLayout, row_tuples
from joins.ssbj.roles import (
    ASKING_ROLES,
    BUCKET,
    KEY_HASH,
    NEW,
    PARTITION,
    ROLE,
    STREAM_ROLES,
    stream_field,
)


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
