"""Algorithm 1 per bucket (joins.ssbj_algorithm), against a point-in-time oracle, no Spark.

A random master evolves by upserts and deletes; random stream batches (hot keys, keys
without master rows, null keys) arrive; steps run through whole R-cycles (incrementing,
switching, phase-out, eviction) and then drain. Whatever the cache decides, every tuple must
be answered exactly once with the master version in force when it arrived, H_R must hold
every row of each cached value at the current version, and the Arrow encoding of the
state must read back as the same state.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache.inequality import TupleSizes
from cache.rcycle import StepPosition
from joins.ssbj_algorithm import (
    BucketState,
    Reload,
    RowChanges,
    StepPlan,
    run_step,
    schedule,
)
from joins.ssbj_buckets import (
    ROLE,
    WideLayout,
    decode_state,
    encode_result,
    master_field,
    stream_field,
)

Row = tuple[Any, ...]
KEYS = [1, 2, 3, 4, 5, 6, None]  # 6 never has master rows; None never matches


def partition_of(row: Row, k: int) -> int:
    return (row[0] * 31 + row[1]) % k


def evolve(master: list[Row], rng: random.Random) -> list[Row]:
    """One commit of another writer: upsert a few (key, supplier) rows, delete some."""
    rows = list(master)
    for _ in range(rng.randint(1, 3)):
        key, supplier = rng.randint(1, 5), rng.randint(0, 3)
        rows = [r for r in rows if (r[0], r[1]) != (key, supplier)]
        if rng.random() < 0.7:
            rows.append((key, supplier, float(rng.randint(0, 99))))
    return rows


def changes(old: list[Row], new: list[Row]) -> RowChanges:
    before, after = Counter(old), Counter(new)
    return RowChanges(list((before - after).elements()), list((after - before).elements()))


def plan_for(
    step: int,
    k: int,
    period: int,
    version: int,
    use_cache: bool,
    left: bool,
    estimator: str,
    state: BucketState,
    control: dict[str, Any],
    takes_input: bool,
) -> tuple[StepPlan, Any]:
    position = StepPosition(step, k, period)
    reads = schedule(
        position,
        version,
        use_cache,
        takes_input,
        {t.pinned_version for t in state.pending},
        control["cache_version"],
        control["switch_version"],
    )
    plan = StepPlan(
        step=step,
        position=position,
        master_version=version,
        stream_key=(1,),
        master_key=(0,),
        sizes=TupleSizes(24.0, 40.0),
        use_cache=use_cache,
        left_join=left,
        estimator=estimator,
        switch_version=reads.collecting,
        partition_versions=reads.partition_versions,
    )
    return plan, reads


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seed=st.integers(0, 10_000),
    k=st.integers(1, 4),
    period=st.integers(1, 3),
    use_cache=st.booleans(),
    left=st.booleans(),
    estimator=st.sampled_from(["paper", "extrapolated"]),
    steps=st.integers(1, 24),
    reload=st.booleans(),
)
def test_every_tuple_is_answered_once_with_its_pinned_version(
    seed: int,
    k: int,
    period: int,
    use_cache: bool,
    left: bool,
    estimator: str,
    steps: int,
    reload: bool,
) -> None:
    rng = random.Random(seed)
    versions = [[(key, s, float(key * 10 + s)) for key in range(1, 6) for s in range(key % 3)]]
    state = BucketState()
    control: dict[str, Any] = {"cache_version": None, "switch_version": None}
    produced: Counter[Row] = Counter()
    expected: Counter[Row] = Counter()
    next_id = 0
    step = 0
    while step < steps or state.pending:
        if step < steps and rng.random() < 0.3:
            versions.append(evolve(versions[-1], rng))
        version = len(versions) - 1
        new: list[Row] = []
        if step < steps:
            hot = rng.choice([1, 2])
            for _ in range(rng.randint(0, 6)):
                new.append((next_id, hot if rng.random() < 0.5 else rng.choice(KEYS)))
                next_id += 1
        for tup in new:  # the oracle: the master in force when the tuple arrived
            matches = [r for r in versions[version] if tup[1] is not None and r[0] == tup[1]]
            expected.update((tup, r, version) for r in matches)
            if left and not matches:
                expected[(tup, None, None)] += 1

        plan, reads = plan_for(
            step, k, period, version, use_cache, left, estimator, state, control, bool(new)
        )

        def delta(base: int | None, now: int = version) -> RowChanges | Reload | None:
            if base is None:
                return None
            if reload:
                return Reload(versions[now])
            return changes(versions[base], versions[now])

        partitions = {
            v: [r for r in versions[v] if partition_of(r, k) == plan.position.partition]
            for v in reads.partition_versions
        }
        result = run_step(
            plan, state, new, partitions, delta(reads.cache_from), delta(reads.switch_from)
        )
        produced.update(result.output)
        counts = result.counts
        assert counts.tuples_in == len(new) == counts.cache_hits + counts.entered_pending
        assert counts.output_rows == len(result.output)
        assert counts.pending_rows == len(result.state.pending)
        for key, rows in result.state.cache.items():  # H_R entries are complete and current
            assert Counter(rows) == Counter(r for r in versions[version] if r[0] == key[0])
        if not use_cache:
            assert not result.state.cache and counts.cache_hits == 0
        state = result.state
        control = {
            "cache_version": version if use_cache else None,
            "switch_version": reads.next_switch_version(control["switch_version"], version),
        }
        step += 1
        assert step < steps + 2 * k + 2, "pending tuples must leave H_S within k steps"
    assert produced == expected


def wide_schema() -> pa.Schema:
    return pa.schema(
        [
            (ROLE, pa.string()),
            (stream_field("id"), pa.int64()),
            (stream_field("k"), pa.int64()),
            (master_field("mk"), pa.int64()),
            (master_field("supplier"), pa.int64()),
            (master_field("price"), pa.float64()),
            ("_entry_step", pa.int64()),
            ("_pinned_version", pa.int64()),
            ("_matched", pa.bool_()),
            ("_version", pa.int64()),
            ("_empty", pa.bool_()),
            ("_change", pa.string()),
            ("_hits", pa.int64()),
            ("_master_rows", pa.int64()),
            ("_observed", pa.int64()),
            ("_metric", pa.string()),
            ("_value", pa.int64()),
        ]
    )


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 10))
def test_state_reads_back_from_its_arrow_encoding(seed: int, steps: int) -> None:
    rng = random.Random(seed)
    layout = WideLayout(("id", "k"), ("mk", "supplier", "price"))
    master = [(key, s, float(s)) for key in range(1, 6) for s in range(key % 3)]
    state = BucketState()
    control: dict[str, Any] = {"cache_version": None, "switch_version": None}
    for step in range(steps):
        new = [(step * 10 + i, rng.choice(KEYS)) for i in range(rng.randint(0, 5))]
        plan, reads = plan_for(step, 2, 2, 0, True, True, "paper", state, control, bool(new))
        partitions = {v: [r for r in master if partition_of(r, 2) == step % 2] for v in [0]}
        result = run_step(plan, state, new, partitions)
        table = encode_result(result, layout, plan, wide_schema())
        decoded = decode_state(table, layout, plan)
        assert Counter(
            (t.row, t.entry_step, t.pinned_version, t.matched) for t in decoded.pending
        ) == Counter(
            (t.row, t.entry_step, t.pinned_version, t.matched) for t in result.state.pending
        )
        assert {k: Counter(v) for k, v in decoded.cache.items()} == {
            k: Counter(v) for k, v in result.state.cache.items()
        }
        assert decoded.counters == result.state.counters
        assert {k: Counter(v) for k, v in decoded.switch_buffer.items()} == {
            k: Counter(v) for k, v in result.state.switch_buffer.items()
        }
        state = decoded
        control = {
            "cache_version": 0,
            "switch_version": reads.next_switch_version(control["switch_version"], 0),
        }
