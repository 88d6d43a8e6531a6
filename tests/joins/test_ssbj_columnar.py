"""The columnar bucket step (``joins/ssbj_columnar.py``) against the reference model:
step after step, the same encoded rows of every role (output, H_S, H_R, counters, s_B,
metrics) from the same bucket tables, over the R-cycle states, eviction, both estimators,
MESHJOIN, left and inner joins, integer and string join values."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joins.ssbj_buckets import (
    NEW,
    PARTITION,
    ROLE,
    STATE_ROLES,
    VERSION,
    BucketDeltas,
    WideLayout,
    bucket_step,
)
from joins.ssbj_columnar import ColumnarLayout, columnar_result
from tests.joins.test_ssbj_algorithm import (
    MASTER,
    STREAM,
    plan_for,
    role_rows,
    wide_schema,
)

LAYOUT = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))


def rows_of(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r.values()) for r in table.to_pylist())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, 3),
    period=st.integers(1, 3),
    use_cache=st.booleans(),
    left=st.booleans(),
    estimator=st.sampled_from(["paper", "extrapolated"]),
    steps=st.integers(1, 16),
    strings=st.booleans(),
)
def test_the_columnar_step_equals_the_reference_model(
    seed: int,
    k: int,
    period: int,
    use_cache: bool,
    left: bool,
    estimator: str,
    steps: int,
    strings: bool,
) -> None:
    rng = random.Random(seed)
    key_type = pa.string() if strings else pa.int64()

    def key(value: int) -> Any:
        return f"k{value}" if strings else value

    # Keys 1-6 with 0, 1 or 2 master rows; a second master version changes some prices.
    master = [(key(v), s, float(s)) for v in range(1, 7) for s in range(v % 3)]
    versions = [master, [(m, s, p + 1.0 if s == 0 else p) for m, s, p in master]]
    stored = wide_schema(key_type).empty_table()
    control: dict[str, Any] = {"cache_version": None, "switch_version": None}
    pinned: set[int] = set()
    compared = 0
    for step in range(steps):
        # The master changes only while nothing is cached (the columnar step does not
        # apply master changes: with them the reference model runs, as here).
        version = 1 if step >= steps // 2 and control["cache_version"] is None else 0
        version = max(version, control["cache_version"] or 0)
        values = [
            rng.choice([1, 1, 1, 2, 2, 3, 4, 5, 6, 7, None]) for _ in range(rng.randint(0, 8))
        ]
        new = [(step * 10 + i, None if v is None else key(v)) for i, v in enumerate(values)]
        state = _pending_versions(stored)
        plan, reads = plan_for(
            step, k, period, version, use_cache, left, estimator, state, control, bool(new)
        )
        partitions = [
            dict(zip(MASTER, m, strict=True)) | {VERSION: v}
            for v in reads.partition_versions
            for m in versions[v]
            if (int(str(m[0]).lstrip("k")) * 31 + m[1]) % k == step % k
        ]
        table = pa.concat_tables(
            [
                stored,
                role_rows(NEW, [dict(zip(STREAM, t, strict=True)) for t in new], key_type),
                role_rows(PARTITION, partitions, key_type),
            ]
        )
        arrow_plan = replace(plan, stream_key=LAYOUT.stream_key_positions)
        if reads.cache_from is not None:
            break  # a master change to apply: outside the columnar step's scope
        shape = ColumnarLayout.of(
            LAYOUT.stream_columns, LAYOUT.master_columns, LAYOUT.stream_keys, LAYOUT.master_keys
        )
        assert shape is not None
        columnar = columnar_result(table, shape, arrow_plan, table.schema)
        assert columnar is not None
        reference = bucket_step(table, LAYOUT, arrow_plan, BucketDeltas(), columnar=False)
        assert rows_of(columnar) == rows_of(reference), f"step {step}"
        assert rows_of(bucket_step(table, LAYOUT, arrow_plan, BucketDeltas())) == rows_of(reference)
        compared += 1
        stored = reference.filter(pc.is_in(reference.column(ROLE), pa.array(list(STATE_ROLES))))
        pinned |= {v for v in stored.column("_pinned_version").to_pylist() if v is not None}
        control = {
            "cache_version": version if use_cache else None,
            "switch_version": reads.next_switch_version(control["switch_version"], version),
        }
    assert compared >= 1


def _pending_versions(stored: pa.Table) -> Any:
    """What ``plan_for`` reads of the state: the pending tuples' pinned versions."""
    from joins.ssbj_algorithm import BucketState, PendingTuple

    pending = stored.filter(pc.equal(stored.column(ROLE), "pending"))
    return BucketState(
        pending=[
            PendingTuple((), (), 0, int(v)) for v in pending.column("_pinned_version").to_pylist()
        ]
    )


def test_the_columnar_step_leaves_floating_and_multi_column_joins_to_the_reference() -> None:
    assert ColumnarLayout.of(("a", "b"), ("x", "y"), ("a", "b"), ("x", "y")) is None
    shape = ColumnarLayout.of(LAYOUT.stream_columns, LAYOUT.master_columns, ("k",), ("mk",))
    assert shape is not None
    table = wide_schema(pa.float64()).empty_table()
    plan, _ = plan_for(0, 2, 1, 0, True, True, "paper", _pending_versions(table), {
        "cache_version": None, "switch_version": None}, False)  # fmt: skip
    assert columnar_result(table, shape, plan, table.schema) is None
