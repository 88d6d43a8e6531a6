"""A step of every bucket at once in the driver (``BucketStep.all_buckets``) against the
same step run bucket by bucket (``BucketStep.__call__`` on each label's rows, as the Spark
tasks run it): step after step, the same multiset of result rows, output, state, metrics,
the buckets' load rows and their key sketches included."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joins.skew.asketch import SketchShape
from joins.ssbj.bucket_decode import BucketDeltas, WideLayout
from joins.ssbj.buckets import BucketStep
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.roles import (
    BUCKET,
    KEY_HASH,
    KEY_LOAD,
    KEY_SKETCH,
    METRIC_ROLE,
    NEW,
    PARTITION,
    ROLE,
    STATE_ROLES,
    VERSION,
)
from tests.joins.ssbj.test_algorithm import MASTER, STREAM, plan_for, role_rows
from tests.joins.ssbj.test_columnar import _pending_versions, rows_of

LAYOUT = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))
LABELS = (0, 1, 5)  # bucket labels need not be 0..n-1 (Spark's task labels are not)


def _hash(value: Any) -> int:
    """A key hash: equal for equal join values, whichever side the row is from."""
    if value is None:
        return 42
    return int(str(value).lstrip("k")) * 7919 + 13


def keyed(table: pa.Table) -> pa.Table:
    """``table`` with each row's key hash and bucket label, as ``keyed_rows_arrow`` adds."""
    roles = table.column(ROLE).to_pylist()
    streams = table.column("s__k").to_pylist()
    masters = table.column("r__mk").to_pylist()
    stream_roles = {"new", "pending", "late", "returning"}
    hashes = [
        _hash(s if r in stream_roles else m)
        for r, s, m in zip(roles, streams, masters, strict=True)
    ]
    labels = [LABELS[h % len(LABELS)] for h in hashes]
    return table.append_column(KEY_HASH, pa.array(hashes, pa.int64())).append_column(
        BUCKET, pa.array(labels, pa.int32())
    )


def by_bucket(function: BucketStep, table: pa.Table, schema: pa.Schema) -> pa.Table:
    labels = table.column(BUCKET)
    results = [
        function(table.filter(pc.equal(labels, label))) for label in pc.unique(labels).to_pylist()
    ]
    return pa.concat_tables([schema.empty_table(), *(r.select(schema.names) for r in results)])


def summed_metrics(table: pa.Table) -> Counter[str]:
    rows = table.filter(pc.equal(table.column(ROLE), METRIC_ROLE))
    found: Counter[str] = Counter()
    for name, value in zip(
        rows.column("_metric").to_pylist(), rows.column("_value").to_pylist(), strict=True
    ):
        found[name] += value
    return found


def without_metrics(table: pa.Table) -> pa.Table:
    return table.filter(pc.not_equal(table.column(ROLE), METRIC_ROLE))


@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, 3),
    use_cache=st.booleans(),
    left=st.booleans(),
    steps=st.integers(1, 12),
    strings=st.booleans(),
    top=st.sampled_from([0, 1, 3]),
    tracked=st.sampled_from([None, (), (1, 2, 7)]),
    sketch=st.booleans(),
)
def test_all_buckets_at_once_equals_the_buckets_one_by_one(
    seed: int,
    k: int,
    use_cache: bool,
    left: bool,
    steps: int,
    strings: bool,
    top: int,
    tracked: tuple[int, ...] | None,
    sketch: bool,
) -> None:
    rng = random.Random(seed)
    key_type = pa.string() if strings else pa.int64()

    def key(value: int) -> Any:
        return f"k{value}" if strings else value

    master = [(key(v), s, float(s)) for v in range(1, 9) for s in range(v % 3)]
    stored = role_rows(NEW, [], key_type)
    control: dict[str, Any] = {"cache_version": None, "switch_version": None}
    roles_seen: Counter[str] = Counter()
    for step in range(steps):
        count = rng.randint(0 if step else 1, 10)
        values = [rng.choice([1, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, None]) for _ in range(count)]
        new = [(step * 10 + i, None if v is None else key(v)) for i, v in enumerate(values)]
        plan, reads = plan_for(
            step,
            k,
            2,
            0,
            use_cache,
            left,
            "extrapolated",
            _pending_versions(stored),
            control,
            bool(new),
        )
        plan = replace(plan, stream_key=LAYOUT.stream_key_positions, sizes=TupleSizes(10.0, 30.0))
        partitions = [
            dict(zip(MASTER, m, strict=True)) | {VERSION: v}
            for v in reads.partition_versions
            for m in master
            if (int(str(m[0]).lstrip("k")) * 31 + m[1]) % k == step % k
        ]
        table = keyed(
            pa.concat_tables(
                [
                    stored,
                    role_rows(NEW, [dict(zip(STREAM, t, strict=True)) for t in new], key_type),
                    role_rows(PARTITION, partitions, key_type),
                ]
            )
        )
        function = BucketStep(
            LAYOUT,
            plan,
            BucketDeltas(),
            top_keys=top,
            tracked=None if tracked is None else [_hash(key(v)) for v in tracked],
            sketch=SketchShape(4, 2, 16) if sketch else None,
        )
        whole = function.all_buckets(table)
        assert whole is not None
        one_by_one = by_bucket(function, table, whole.schema)
        # Each bucket reports its own counts and the step sums them: compare the sums.
        assert summed_metrics(whole) == summed_metrics(one_by_one), step
        assert rows_of(without_metrics(whole)) == rows_of(without_metrics(one_by_one)), step
        roles_seen.update(whole.column(ROLE).to_pylist())
        stored = one_by_one.filter(
            pc.is_in(one_by_one.column(ROLE), pa.array(list(STATE_ROLES)))
        ).select(role_rows(NEW, [], key_type).schema.names)
        control = {
            "cache_version": 0 if use_cache else None,
            "switch_version": reads.next_switch_version(control["switch_version"], 0),
        }
    assert roles_seen[METRIC_ROLE] and roles_seen[KEY_LOAD]
    assert bool(roles_seen[KEY_SKETCH]) == sketch


def test_all_buckets_leaves_master_changes_to_the_buckets() -> None:
    plan, _ = plan_for(
        0,
        1,
        1,
        0,
        True,
        False,
        "extrapolated",
        _pending_versions(role_rows(NEW, [])),
        {"cache_version": None, "switch_version": None},
        True,
    )
    plan = replace(plan, stream_key=LAYOUT.stream_key_positions)
    table = keyed(role_rows(NEW, [{"s__id": 1, "s__k": 1}]))
    assert BucketStep(LAYOUT, plan, BucketDeltas(cache="changes")).all_buckets(table) is None
    assert BucketStep(LAYOUT, plan, BucketDeltas()).all_buckets(table) is not None
