"""Key routing: Spark's hash placement reproduced, the routing table, the monitor."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.skew.greedyfit import KeyLoad, imbalance
from joins.skew.key_routing import (
    BucketLoad,
    KeyRouting,
    murmur3_int,
    plan_splits,
    rebalance,
    spread_loads,
    task_labels,
)
from joins.ssbj.bucket_routing import bucket_label, bucket_labels
from joins.ssbj.roles import CACHE, COUNTER, MARKED, NEW, PARTITION, PENDING, SWITCH

INTS = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), 123_456_789, -987_654]


def test_murmur3_and_the_labels_match_sparks_own_partitioning(spark: SparkSession) -> None:
    """The labels are only useful if Spark's HashPartitioning agrees: checked on the real
    shuffle, not on a re-implementation."""
    frame = spark.createDataFrame(
        [(v,) for v in INTS], T.StructType([T.StructField("v", T.IntegerType())])
    )
    assert [r[0] for r in frame.select(F.hash("v")).collect()] == [murmur3_int(v) for v in INTS]
    for buckets in (1, 3, 8, 13):
        labels = task_labels(buckets)
        assert len(set(labels)) == buckets
        rows = spark.createDataFrame(
            [(b, label) for b, label in enumerate(labels)],
            T.StructType(
                [T.StructField("b", T.IntegerType()), T.StructField("label", T.IntegerType())]
            ),
        )
        placed = (
            rows.repartition(buckets, "label")
            .select("b", F.spark_partition_id().alias("task"))
            .collect()
        )
        assert sorted((r.b, r.task) for r in placed) == [(b, b) for b in range(buckets)]


def test_bucket_label_follows_the_routing_table(spark: SparkSession) -> None:
    hashes = [-9, -1, 0, 5, 11, 2**62, -(2**62)]
    routing = KeyRouting(4).with_moves({5: 0, 11: 3, -9: 2}, limit=10)
    frame = spark.createDataFrame(
        [(h,) for h in hashes], T.StructType([T.StructField("h", T.LongType())])
    )
    got = [r[0] for r in frame.select(bucket_label(F.col("h"), routing)).collect()]
    labels = task_labels(4)
    assert got == [labels[routing.bucket(h)] for h in hashes]
    assert routing.bucket(5) == 0 and routing.bucket(0) == 0 and routing.bucket(-1) == 3


def test_routing_table_moves_home_caps_and_round_trips() -> None:
    routing = KeyRouting(4).with_moves({1: 2, 2: 2, 3: 0}, limit=10)
    assert routing.moved == ((1, 2), (3, 0))  # 2 is home in bucket 2: no entry
    routing = routing.with_moves({1: 1}, limit=10)  # moved home: the entry goes
    assert routing.moved == ((3, 0),)
    capped = routing.with_moves({5: 0, 6: 0}, limit=2)  # the oldest move (3) goes home
    assert capped.moved == ((5, 0), (6, 0))
    assert KeyRouting.from_dict(capped.to_dict()) == capped
    for bad in ({"buckets": 2, "moved": [[1, 5]]}, {"buckets": 2, "moved": [[1, 1]]}, {}):
        try:
            KeyRouting.from_dict(bad)
        except ValueError as e:
            assert "KeyRouting" in str(e)
        else:
            raise AssertionError(f"{bad} was accepted")


@st.composite
def some_loads(draw: st.DrawFn) -> list[BucketLoad]:
    buckets = draw(st.integers(2, 6))
    loads = []
    next_key = 0
    for b in range(buckets):
        keys = []
        for _ in range(draw(st.integers(0, 5))):
            keys.append(KeyLoad(next_key, draw(st.integers(0, 50)), draw(st.integers(0, 50))))
            next_key += 1
        rest_stored, rest_probes = draw(st.integers(0, 20)), draw(st.integers(0, 20))
        loads.append(
            BucketLoad(
                b,
                rest_stored + sum(k.stored for k in keys),
                rest_probes + sum(k.probes for k in keys),
                tuple(keys),
            )
        )
    return loads


@settings(max_examples=200, deadline=None)
@given(
    loads=some_loads(),
    theta=st.sampled_from([1.0, 1.2, 2.0]),
    method=st.sampled_from(["greedyfit", "safit"]),
)
def test_the_monitor_never_worsens_the_imbalance_and_moves_only_reported_keys(
    loads: list[BucketLoad], theta: float, method: str
) -> None:
    """Each move narrows the gap between the heaviest and the lightest bucket without
    crossing it (Eq. 9), so LI never grows; only reported keys move, each from the bucket
    that holds it at that point."""
    routing = KeyRouting(len(loads))
    plan = rebalance(routing, loads, theta, method)  # type: ignore[arg-type]
    assert plan.before == imbalance([b.load for b in loads])
    assert plan.after <= plan.before
    if plan.before <= theta:
        assert plan.migrations == ()
    where = {k.key: b.bucket for b in loads for k in b.keys}
    for m in plan.migrations:
        assert m.source != m.target
        for key in m.keys:
            assert where[key] == m.source
            where[key] = m.target
    sizes = {k.key: k.stored for b in loads for k in b.keys}
    assert plan.moved_tuples == sum(sizes[k] for m in plan.migrations for k in m.keys)


def test_a_hot_key_beside_an_idle_bucket_moves_there() -> None:
    loads = [
        BucketLoad(0, 10, 100, (KeyLoad(7, 5, 60), KeyLoad(8, 5, 40))),
        BucketLoad(1, 10, 100, ()),
        BucketLoad(2, 0, 0, ()),
    ]
    plan = rebalance(KeyRouting(3), loads, 1.2)
    assert plan.before == float("inf")
    assert [(m.source, m.target) for m in plan.migrations][:1] == [(0, 2)]
    assert plan.after < plan.before
    bad = [BucketLoad(5, 1, 1)]
    try:
        rebalance(KeyRouting(3), bad, 1.2)
    except ValueError as e:
        assert "buckets [5]" in str(e)
    else:
        raise AssertionError("a load of an unknown bucket was accepted")


def test_split_keys_validate_round_trip_and_give_way_to_moves() -> None:
    routing = KeyRouting(4).with_splits({6: (0, 3), 9: (2,)})
    assert routing.targets(6) == (2, 0, 3) and routing.targets(9) == (1, 2)
    assert routing.targets(5) == (1,)
    assert KeyRouting.from_dict(routing.to_dict()) == routing
    assert routing.with_moves({6: 1}, limit=10).split == ((9, (2,)),)  # moved whole again
    # the owner (2) is no replica of its own key; nothing left means no split
    assert KeyRouting(4).with_splits({6: (2, 3)}).split == ((6, (3,)),)
    assert KeyRouting(4).with_splits({6: (2,)}).split == ()
    for bad in ([[6, [2]]], [[6, [0, 0]]], [[6, [4]]], [[6, []]]):
        try:
            KeyRouting.from_dict({"buckets": 4, "moved": [], "split": bad})
        except ValueError as e:
            assert "key hash 6" in str(e)
        else:
            raise AssertionError(f"split {bad} was accepted")


def test_a_key_hotter_than_a_bucket_is_split_over_the_least_loaded_buckets() -> None:
    loads = [
        BucketLoad(0, 10, 900, (KeyLoad(8, 4, 800), KeyLoad(4, 1, 50))),
        BucketLoad(1, 10, 20),
        BucketLoad(2, 10, 5),
        BucketLoad(3, 10, 75, (KeyLoad(3, 1, 75),)),
    ]
    routing = KeyRouting(4)
    splits = plan_splits(routing, loads, factor=2.0)
    # mean probes 250: key 8 (800) needs ceil(800 / 250) = 4 buckets, every other one
    assert splits == {8: (1, 2, 3)}
    # STA's two choices: the owner and the least loaded other bucket
    assert plan_splits(routing, loads, factor=2.0, ways=2) == {8: (2,)}
    assert plan_splits(routing, loads, factor=4.0) == {}
    with pytest.raises(ValueError, match="ways >= 2"):
        plan_splits(routing, loads, factor=2.0, ways=1)
    plan = rebalance(routing, loads, theta=100.0, split_factor=2.0)
    assert plan.splits == ((8, (1, 2, 3)),)
    assert all(8 not in m.keys for m in plan.migrations)
    try:
        plan_splits(routing, loads, factor=0.5)
    except ValueError as e:
        assert "factor" in str(e)
    else:
        raise AssertionError("a split factor below 1 was accepted")


@settings(max_examples=100, deadline=None)
@given(
    loads=some_loads(),
    factor=st.sampled_from([1.0, 1.5, 3.0]),
    ways=st.sampled_from([None, 2, 3]),
)
def test_splitting_keeps_every_probe_and_stored_row(
    loads: list[BucketLoad], factor: float, ways: int | None
) -> None:
    routing = KeyRouting(len(loads))
    splits = plan_splits(routing, loads, factor, ways)
    assert all(len(replicas) < (ways or len(loads) + 1) for replicas in splits.values())
    spread = spread_loads(loads, routing.with_splits(splits), splits)
    assert sum(b.probes for b in spread) == sum(b.probes for b in loads)
    assert sum(b.stored for b in spread) == sum(b.stored for b in loads)
    for key_hash, replicas in splits.items():
        assert routing.bucket(key_hash) not in replicas


def test_split_keys_rows_reach_their_buckets_by_role(spark: SparkSession) -> None:
    """Stream tuples of a split key spread over its buckets, one bucket each; the rows a
    replica needs reach all of them; its other state stays with the owner; other keys are
    not touched."""
    routing = KeyRouting(4).with_splits({6: (0, 3)})  # owner 2
    labels = task_labels(4)
    rows = [(6, NEW, t) for t in range(60)] + [(6, PENDING, t) for t in range(60, 120)]
    rows += [(6, role, 0) for role in (CACHE, PARTITION, COUNTER, MARKED, SWITCH)]
    rows += [(5, NEW, t) for t in range(5)] + [(5, CACHE, 0)]
    frame = spark.createDataFrame(
        rows,
        T.StructType(
            [
                T.StructField("h", T.LongType()),
                T.StructField("role", T.StringType()),
                T.StructField("t", T.LongType()),
            ]
        ),
    )
    placed = frame.select(
        "h",
        "role",
        "t",
        bucket_labels(F.col("h"), F.col("role"), F.xxhash64("t"), routing).alias("labels"),
    ).collect()
    bucket = {label: b for b, label in enumerate(labels)}
    got = {(r.h, r.role, r.t): sorted(bucket[x] for x in r.labels) for r in placed}
    tuples = [(6, NEW, t) for t in range(60)] + [(6, PENDING, t) for t in range(60, 120)]
    assert all(len(got[t]) == 1 for t in tuples)
    assert {got[t][0] for t in tuples[:60]} == {got[t][0] for t in tuples[60:]} == {0, 2, 3}
    for role in (CACHE, PARTITION, MARKED, SWITCH):  # s_B too: it becomes the cache
        assert got[(6, role, 0)] == [0, 2, 3], role
    assert got[(6, COUNTER, 0)] == [2]
    assert {tuple(got[(5, NEW, t)]) for t in range(5)} == {(1,)} == {tuple(got[(5, CACHE, 0)])}
