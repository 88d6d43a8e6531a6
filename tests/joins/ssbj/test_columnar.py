"""The columnar bucket step (``joins/ssbj/columnar.py``) against the reference model:
step after step, the same encoded rows of every role (output, H_S, H_R, counters, s_B,
metrics) from the same bucket tables, over the R-cycle states, eviction, both estimators,
MESHJOIN, left and inner joins, integer and string join values."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joins.ssbj import bucket_decode
from joins.ssbj.algorithm import run_step
from joins.ssbj.bucket_encode import encode_result
from joins.ssbj.buckets import BucketStep, bucket_step
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.rcycle import CycleState
from joins.ssbj.columnar import columnar_result
from joins.ssbj.columnar_tables import ColumnarLayout
from joins.ssbj.roles import (
    ADDED,
    CACHE,
    CACHE_CHANGE,
    CHANGE,
    EMPTY,
    MARKED,
    NEW,
    PARTITION,
    PENDING,
    REMOVED,
    ROLE,
    STATE_ROLES,
    SWITCH_CHANGE,
    VERSION,
    stream_field,
)
from joins.ssbj.roles import PINNED_VERSION as PINNED
from tests.joins.ssbj.strategies import run_parameters
from tests.joins.ssbj.test_algorithm import (
    MASTER,
    STREAM,
    changes,
    plan_for,
    role_rows,
    wide_schema,
)

LAYOUT = bucket_decode.WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))


def rows_of(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(
        tuple(tuple(v) if isinstance(v, list) else v for v in r.values()) for r in table.to_pylist()
    )


@dataclass
class Compared:
    """What one run compared: steps in all, and steps whose master partition was read at
    more than one version while H_R held rows (tuples pinned to a version the cache has
    moved past)."""

    steps: int = 0
    multi_version_with_cache: int = 0


@dataclass(frozen=True)
class Case:
    """One run's settings: the R-cycle (k, eviction period), the join, the estimator, the
    steps, string or integer join values, the switch factor, tuple sizes, and the values
    an ASketch tracks (None: exact counters)."""

    seed: int
    k: int
    period: int
    use_cache: bool
    left: bool
    estimator: str
    steps: int
    strings: bool
    factor: float
    sizes: tuple[float, float]
    tracked: tuple[int, ...] | None


def run_against_reference(case: Case) -> Compared:
    """Steps of one bucket; each step without master changes to apply runs the columnar
    step and the reference model on the same table and compares them. A step that must
    bring H_R or s_B to a newer master version runs the reference model alone, as the
    pipeline does (``pipeline.ssbj.placement.reads_in_driver``), and the steps after it go
    on comparing with H_R at the new version and older tuples pinned to the old one."""
    seed, k, period, use_cache, left = case.seed, case.k, case.period, case.use_cache, case.left
    estimator, steps, strings, tracked = case.estimator, case.steps, case.strings, case.tracked
    factor, sizes = case.factor, case.sizes
    rng = random.Random(seed)
    key_type = pa.string() if strings else pa.int64()

    def key(value: int) -> Any:
        return f"k{value}" if strings else value

    # Keys 1-6 with 0, 1 or 2 master rows; a second master version changes some prices
    # and drops key 4's rows.
    master = [(key(v), s, float(s)) for v in range(1, 7) for s in range(v % 3)]
    versions = [
        master,
        [(m, s, p + 1.0 if s == 0 else p) for m, s, p in master if m != key(4)],
    ]
    stored = wide_schema(key_type).empty_table()
    control: dict[str, Any] = {"cache_version": None, "switch_version": None}
    compared = Compared()
    tracked_keys = None if tracked is None else frozenset((key(v),) for v in tracked)
    for step in range(steps):
        version = 1 if step >= steps // 2 else 0
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
                _change_rows(CACHE_CHANGE, versions, reads.cache_from, version, key_type),
                _change_rows(SWITCH_CHANGE, versions, reads.switch_from, version, key_type),
            ]
        )
        arrow_plan = replace(
            plan,
            stream_key=LAYOUT.stream_key_positions,
            switch_factor=factor,
            sizes=TupleSizes(*sizes),
        )
        deltas = bucket_decode.BucketDeltas(
            cache=None if reads.cache_from is None else "changes",
            switch=None if reads.switch_from is None else "changes",
        )
        if tracked_keys is None:
            reference = bucket_step(table, BucketStep(LAYOUT, arrow_plan, deltas), columnar=False)
        else:
            reference = reference_step(table, arrow_plan, tracked_keys, deltas)
        if deltas == bucket_decode.BucketDeltas():
            shape = ColumnarLayout.of(
                LAYOUT.stream_columns, LAYOUT.master_columns, LAYOUT.stream_keys, LAYOUT.master_keys
            )
            assert shape is not None
            values_tracked = (
                None if tracked is None else pa.array([key(v) for v in tracked], key_type)
            )
            columnar = columnar_result(table, shape, arrow_plan, table.schema, values_tracked)
            assert columnar is not None
            if tracked is None:
                fast = bucket_step(table, BucketStep(LAYOUT, arrow_plan, deltas))
                assert rows_of(fast) == rows_of(reference)
            assert rows_of(columnar) == rows_of(reference), f"step {step}"
            compared.steps += 1
            # H_R holds master rows (not only empty markers) at the step's version, while
            # tuples pinned to an older version still wait.
            rows_cached = pc.and_(
                pc.equal(stored.column(ROLE), CACHE),
                pc.invert(pc.fill_null(stored.column(EMPTY), False)),
            )
            pinned = stored.filter(pc.equal(stored.column(ROLE), PENDING)).column(PINNED)
            if (
                pc.any(rows_cached).as_py()
                and control["cache_version"] == version
                and any(v < version for v in pinned.to_pylist())
            ):
                compared.multi_version_with_cache += 1
        stored = reference.filter(pc.is_in(reference.column(ROLE), pa.array(list(STATE_ROLES))))
        control = {
            "cache_version": version if use_cache else None,
            "switch_version": reads.next_switch_version(control["switch_version"], version),
        }
    return compared


def _change_rows(
    role: str,
    versions: list[list[tuple[Any, ...]]],
    since: int | None,
    version: int,
    key_type: pa.DataType,
) -> pa.Table:
    """The master rows that changed from ``since`` to ``version``, as ``role`` rows."""
    if since is None:
        return role_rows(role, [], key_type)
    delta = changes(versions[since], versions[version])
    master = lambda r: dict(zip(MASTER, r, strict=True))  # noqa: E731
    return role_rows(
        role,
        [master(r) | {CHANGE: REMOVED} for r in delta.removed]
        + [master(r) | {CHANGE: ADDED} for r in delta.added],
        key_type,
    )


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.builds(
        Case,
        **run_parameters(partitions=3, steps=16),
        strings=st.booleans(),
        factor=st.sampled_from([0.5, 1.0, 1.5]),
        sizes=st.sampled_from([(24.0, 40.0), (40.0, 24.0), (10.0, 30.0)]),
        tracked=st.sampled_from([None, (), (1,), (1, 2, 7)]),
    )
)
def test_the_columnar_step_equals_the_reference_model(case: Case) -> None:
    assert run_against_reference(case).steps >= 1


def test_steps_after_a_cache_refresh_compare_partitions_read_at_two_versions() -> None:
    """The case the random runs may miss: H_R moved to the new master version while older
    tuples still wait pinned to the old one, so the partition is read at both versions
    and the incrementing phase must count each tuple against its own version's rows."""
    found = Compared()
    for seed in range(12):
        for k in (2, 3):
            # Eviction every second cycle (period 2) lets H_R keep rows across a phase-out.
            case = Case(
                seed, k, 2, True, seed % 2 == 0, "paper", 16, seed % 3 == 0, 1.0, (40.0, 24.0), None
            )
            one = run_against_reference(case)
            found.steps += one.steps
            found.multi_version_with_cache += one.multi_version_with_cache
    assert found.multi_version_with_cache >= 3, found


def reference_step(
    table: pa.Table,
    plan: Any,
    tracked: frozenset[tuple[Any, ...]],
    deltas: bucket_decode.BucketDeltas | None = None,
) -> pa.Table:
    """The reference model's step with only ``tracked`` values instrumented (what
    ``bucket_step`` runs for a table whose rows carry key hashes)."""
    deltas = deltas or bucket_decode.BucketDeltas()
    roles = bucket_decode.BucketRoles(table)
    state = bucket_decode.decode_state(roles, LAYOUT, plan)
    new, _ = roles.stream_tuples(NEW, LAYOUT)
    wanted = {t.key for t in state.pending} | {plan.stream_key_of(row) for row in new}
    wanted |= set(state.switch_buffer)
    parts = bucket_decode.partition_rows(roles, LAYOUT, wanted)
    result = run_step(
        plan,
        state,
        new,
        parts,
        bucket_decode.master_delta(roles, CACHE_CHANGE, deltas.cache, LAYOUT),
        bucket_decode.master_delta(roles, SWITCH_CHANGE, deltas.switch, LAYOUT),
        tracked=tracked,
    )
    return encode_result(result, LAYOUT, plan, table, table.schema)


def _pending_versions(stored: pa.Table) -> Any:
    """What ``plan_for`` reads of the state: the pending tuples' pinned versions."""
    from joins.ssbj.algorithm import BucketState, PendingTuple

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


def _one_step(
    table: pa.Table, layout: bucket_decode.WideLayout = LAYOUT
) -> tuple[pa.Table, pa.Table]:
    plan, _ = plan_for(1, 2, 1, 0, True, True, "paper", _pending_versions(table), {
        "cache_version": None, "switch_version": None}, True)  # fmt: skip
    plan = replace(plan, stream_key=layout.stream_key_positions)
    fast = bucket_step(table, BucketStep(layout, plan, bucket_decode.BucketDeltas()))
    return fast, bucket_step(
        table, BucketStep(layout, plan, bucket_decode.BucketDeltas()), columnar=False
    )


def test_counters_handed_over_by_a_split_keys_replicas_are_merged_as_the_reference_does() -> None:
    counters = [
        {MASTER[0]: 1, "_hits": 2, "_master_rows": 3, "_observed": 1},
        {MASTER[0]: 1, "_hits": 5, "_master_rows": 4, "_observed": 2},
    ]
    table = pa.concat_tables(
        [
            role_rows("counter", counters),
            role_rows(NEW, [{STREAM[0]: 1, STREAM[1]: 1}, {STREAM[0]: 2, STREAM[1]: 2}]),
            role_rows(PARTITION, [{MASTER[0]: 1, MASTER[1]: 0, MASTER[2]: 1.0, VERSION: 0}]),
        ]
    )
    fast, reference = _one_step(table)
    assert rows_of(fast) == rows_of(reference)
    merged = fast.filter(pc.equal(fast.column(ROLE), "counter")).to_pylist()
    # Key 1: hits 2 + 5, master rows max(3, 4) + its one row in this partition, observed
    # max(1, 2) + this step (an incrementing one).
    assert [
        (r["_hits"], r["_master_rows"], r["_observed"]) for r in merged if r[MASTER[0]] == 1
    ] == [(7, 5, 3)]


def test_nested_stream_columns_ride_along_and_narrowing_keys_are_left_to_the_reference() -> None:
    schema = wide_schema().append(pa.field(stream_field("tags"), pa.list_(pa.string())))
    layout = bucket_decode.WideLayout(
        ("id", "k", "tags"), ("mk", "supplier", "price"), ("k",), ("mk",)
    )
    rows = [
        {ROLE: NEW, STREAM[0]: 1, STREAM[1]: 1, stream_field("tags"): ["a", "b"]},
        {ROLE: PARTITION, MASTER[0]: 1, MASTER[1]: 0, MASTER[2]: 1.0, VERSION: 0},
    ]
    table = pa.Table.from_pylist(rows, schema=schema)
    fast, reference = _one_step(table, layout)
    assert rows_of(fast) == rows_of(reference)
    nested = ColumnarLayout.of(layout.stream_columns, layout.master_columns, ("k",), ("mk",))
    assert nested is not None
    plan, _ = plan_for(1, 2, 1, 0, True, True, "paper", _pending_versions(table), {
        "cache_version": None, "switch_version": None}, True)  # fmt: skip
    plan = replace(plan, stream_key=layout.stream_key_positions)
    direct = columnar_result(table, nested, plan, table.schema)
    assert direct is not None and rows_of(direct) == rows_of(reference)
    # An int64 stream key against an int32 master key: the columnar pass declines.
    narrow = wide_schema().set(
        wide_schema().get_field_index(MASTER[0]), pa.field(MASTER[0], pa.int32())
    )
    shape = ColumnarLayout.of(LAYOUT.stream_columns, LAYOUT.master_columns, ("k",), ("mk",))
    assert shape is not None
    plan, _ = plan_for(0, 2, 1, 0, True, True, "paper", _pending_versions(narrow.empty_table()), {
        "cache_version": None, "switch_version": None}, False)  # fmt: skip
    assert columnar_result(narrow.empty_table(), shape, plan, narrow) is None


@pytest.mark.parametrize("estimator", ["extrapolated", "paper"])
def test_a_value_whose_rows_were_not_seen_yet_stays_in_h_s_under_extrapolation(
    estimator: str,
) -> None:
    """At the switching cycle's first step (k = 4; v_S = 24 B, v_R = 40 B): key 1 was
    pending over 2 of the 4 partitions and no row of it was counted, so its rows are not
    known and it stays in H_S (the paper's s_count takes it as m = 0 and switches it);
    key 2 was seen over all 4 with no row, m = 0: the negative cache; key 3 had its one
    row counted over 2 partitions, m = 2 extrapolated: 4 tuples (96 B) > 80 B. The Arrow
    step decides as the reference model."""
    counters = [
        {MASTER[0]: 1, "_hits": 0, "_master_rows": 0, "_observed": 2},
        {MASTER[0]: 2, "_hits": 0, "_master_rows": 0, "_observed": 4},
        {MASTER[0]: 3, "_hits": 0, "_master_rows": 1, "_observed": 2},
    ]
    keys = [1, 1, 1, 2, 3, 3, 3, 3]
    table = pa.concat_tables(
        [
            role_rows("counter", counters),
            role_rows(NEW, [{STREAM[0]: i, STREAM[1]: k} for i, k in enumerate(keys)]),
            role_rows(PARTITION, [{MASTER[0]: 9, MASTER[1]: 0, MASTER[2]: 1.0, VERSION: 0}]),
        ]
    )
    control = {"cache_version": 0, "switch_version": None}
    plan, _ = plan_for(4, 4, 5, 0, True, False, estimator, _pending_versions(table), control, True)
    assert plan.position.state is CycleState.SWITCHING and plan.position.starts_cycle
    plan = replace(plan, stream_key=LAYOUT.stream_key_positions)
    fast = bucket_step(table, BucketStep(LAYOUT, plan, bucket_decode.BucketDeltas()))
    reference = bucket_step(
        table, BucketStep(LAYOUT, plan, bucket_decode.BucketDeltas()), columnar=False
    )
    assert rows_of(fast) == rows_of(reference)
    marked = {r[MASTER[0]] for r in fast.filter(pc.equal(fast.column(ROLE), MARKED)).to_pylist()}
    assert marked == ({2, 3} if estimator == "extrapolated" else {1, 2, 3})
