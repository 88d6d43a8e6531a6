"""Algorithm 1 per bucket (joins.ssbj.algorithm), against a point-in-time oracle, no Spark.

A random master evolves by upserts and deletes; random stream batches (hot keys, keys
without master rows, null keys) arrive; steps run through whole R-cycles (incrementing,
switching, phase-out, eviction) and then drain. Whatever the cache decides, every tuple must
be answered exactly once with the master version in force when it arrived, H_R must hold
every row of each cached value at the current version, and the Arrow encoding of the
state must read back as the same state.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joins.skew.asketch import ASketch, SketchShape
from joins.ssbj import roles
from joins.ssbj.algorithm import (
    BucketState,
    KeyCounters,
    Reload,
    RowChanges,
    StepPlan,
    run_step,
    schedule,
)
from joins.ssbj.bucket_decode import BucketDeltas, WideLayout
from joins.ssbj.buckets import BucketStep, bucket_step
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.rcycle import CycleState, StepPosition
from tests.joins.ssbj.strategies import run_parameters

Row = tuple[Any, ...]
KEY_TYPE = pa.int64()
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
    **run_parameters(partitions=4, steps=24),
    reload=st.booleans(),
    tracked=st.sampled_from([None, frozenset(), frozenset({(1,)}), frozenset({(2,), (6,)})]),
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
    tracked: frozenset[tuple[int]] | None,
) -> None:
    """``tracked`` (the values an ASketch picked, or None for exact counts) may change
    which values are cached, never the answer; only tracked values get counters and
    enter the cache."""
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
            plan,
            state,
            new,
            partitions,
            delta(reads.cache_from),
            delta(reads.switch_from),
            tracked=tracked,
        )
        produced.update(result.output)
        counts = result.counts
        assert counts.counter_rows == len(result.state.counters)
        if tracked is not None:
            assert set(result.state.counters) <= tracked
            assert set(result.state.cache) | set(result.state.switch_buffer) <= tracked
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


def wide_schema(key_type: pa.DataType = KEY_TYPE) -> pa.Schema:
    return pa.schema(
        [
            (roles.ROLE, pa.string()),
            (roles.stream_field("id"), pa.int64()),
            (roles.stream_field("k"), key_type),
            (roles.master_field("mk"), key_type),
            (roles.master_field("supplier"), pa.int64()),
            (roles.master_field("price"), pa.float64()),
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


def role_rows(role: str, rows: list[dict[str, Any]], key_type: pa.DataType = KEY_TYPE) -> pa.Table:
    schema = wide_schema(key_type)
    return pa.Table.from_pylist([{roles.ROLE: role, **r} for r in rows], schema=schema)


def of_role(table: pa.Table, role: str, columns: list[str]) -> Counter[Row]:
    rows = table.filter(pc.equal(table.column(roles.ROLE), role)).select(columns).to_pylist()
    return Counter(tuple(r.values()) for r in rows)


STREAM = [roles.stream_field("id"), roles.stream_field("k")]
MASTER = [roles.master_field("mk"), roles.master_field("supplier"), roles.master_field("price")]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 12), left=st.booleans())
def test_the_arrow_bucket_step_equals_the_reference_step(seed: int, steps: int, left: bool) -> None:
    """bucket_step (tuples decoded as join value + position, state encoded in Arrow) does
    what run_step does on whole rows, step after step, H_R following master changes."""
    rng = random.Random(seed)
    layout = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))
    versions = [[(key, s, float(s)) for key in range(1, 6) for s in range(key % 3)]]
    state = BucketState()
    stored = wide_schema().empty_table()  # the Arrow side's state, as the table keeps it
    control: dict[str, Any] = {"cache_version": None, "switch_version": None}
    for step in range(steps):
        if rng.random() < 0.3:
            versions.append(evolve(versions[-1], rng))
        version = len(versions) - 1
        new = [(step * 10 + i, rng.choice(KEYS)) for i in range(rng.randint(0, 5))]
        plan, reads = plan_for(step, 2, 2, version, True, left, "paper", state, control, bool(new))
        partitions = {
            v: [r for r in versions[v] if partition_of(r, 2) == step % 2]
            for v in reads.partition_versions
        }
        delta = (
            changes(versions[reads.cache_from], versions[version])
            if reads.cache_from is not None
            else None
        )
        reference = run_step(plan, state, new, partitions, delta)

        master = lambda r: dict(zip(MASTER, r, strict=True))  # noqa: E731
        table = pa.concat_tables(
            [
                stored,
                role_rows(roles.NEW, [dict(zip(STREAM, t, strict=True)) for t in new]),
                role_rows(
                    roles.PARTITION,
                    [
                        master(r) | {roles.VERSION: v}
                        for v, rows in partitions.items()
                        for r in rows
                    ],
                ),
                role_rows(
                    roles.CACHE_CHANGE,
                    [
                        master(r) | {roles.CHANGE: roles.REMOVED}
                        for r in (delta.removed if delta else [])
                    ]
                    + [
                        master(r) | {roles.CHANGE: roles.ADDED}
                        for r in (delta.added if delta else [])
                    ],
                ),
            ]
        )
        arrow_plan = replace(plan, stream_key=layout.stream_key_positions)
        deltas = BucketDeltas(cache="changes" if delta is not None else None)
        result = bucket_step(table, BucketStep(layout, arrow_plan, deltas))

        assert of_role(result, roles.OUT, [*STREAM, *MASTER, roles.VERSION]) == Counter(
            (*s, *(m if m is not None else (None,) * 3), v) for s, m, v in reference.output
        )
        assert of_role(
            result, roles.PENDING, [*STREAM, roles.ENTRY_STEP, roles.PINNED_VERSION, roles.MATCHED]
        ) == Counter(
            (*t.row, t.entry_step, t.pinned_version, t.matched) for t in reference.state.pending
        )
        expected_cache: Counter[Row] = Counter()
        for key, rows in reference.state.cache.items():
            expected_cache.update((*r, False) for r in rows)
            if not rows:
                expected_cache[(key[0], None, None, True)] += 1
        assert of_role(result, roles.CACHE, [*MASTER, roles.EMPTY]) == expected_cache
        assert of_role(
            result, roles.COUNTER, [MASTER[0], roles.HITS, roles.MASTER_ROWS, roles.OBSERVED]
        ) == Counter(
            (key[0], c.hits, c.master_rows, c.observed)
            for key, c in reference.state.counters.items()
        )
        assert of_role(result, roles.SWITCH, MASTER) == Counter(
            r for rows in reference.state.switch_buffer.values() for r in rows
        )
        metrics = of_role(result, roles.METRIC_ROLE, [roles.METRIC, roles.VALUE])
        assert (("output_rows", len(reference.output)), 1) in metrics.items()
        keep = pc.is_in(result.column(roles.ROLE), value_set=pa.array(list(roles.STATE_ROLES)))
        stored = result.filter(keep)
        state = reference.state
        control = {
            "cache_version": version,
            "switch_version": reads.next_switch_version(control["switch_version"], version),
        }


def test_nan_and_signed_zero_join_values_meet_as_in_spark_and_duckdb() -> None:
    """NaN = NaN and -0.0 = 0.0 in Spark's and DuckDB's equi-joins; Python's dicts compare
    NaN by identity (every decoded NaN is a new object) and Arrow's is_in hashes bits. Both
    the reference step and the Arrow step (which decodes tuples and filters partition rows
    itself) must match them; null still matches nothing."""
    nan = float("nan")
    state, control = BucketState(), {"cache_version": None, "switch_version": None}
    plan, _ = plan_for(0, 1, 1, 0, False, True, "paper", state, control, True)
    new = [(1, float("nan")), (2, None), (3, 2.5), (4, -0.0)]
    master = [
        (float("nan"), 0, 1.0),
        (float("nan"), 1, 2.0),
        (2.5, 0, 3.0),
        (None, 0, 4.0),
        (0.0, 2, 5.0),
    ]
    result = run_step(plan, state, new, {0: master}, None)
    matched = Counter((s[0], m[1] if m else None) for s, m, _ in result.output)
    assert matched == Counter({(1, 0): 1, (1, 1): 1, (2, None): 1, (3, 0): 1, (4, 2): 1})

    layout = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))
    key_type = pa.float64()
    table = pa.concat_tables(
        [
            role_rows(roles.NEW, [dict(zip(STREAM, t, strict=True)) for t in new], key_type),
            role_rows(
                roles.PARTITION,
                [dict(zip(MASTER, r, strict=True)) | {roles.VERSION: 0} for r in master],
                key_type,
            ),
        ]
    )
    arrow_plan = replace(plan, stream_key=layout.stream_key_positions)
    out = bucket_step(table, BucketStep(layout, arrow_plan, BucketDeltas()))
    rows = (
        out.filter(pc.equal(out.column(roles.ROLE), roles.OUT))
        .select([STREAM[0], MASTER[1]])
        .to_pylist()
    )
    assert Counter((r[STREAM[0]], r[MASTER[1]]) for r in rows) == matched
    assert nan != nan  # the test data's NaNs really are distinct objects that compare unequal


def hashed_bucket(
    new: Sequence[tuple[int, int | None]],
    master: Sequence[tuple[int, int, float]],
    hashes: Mapping[int | None, int],
    label: int,
) -> pa.Table:
    """A bucket's input as the step's shuffle delivers it: new tuples and partition rows
    of version 0, with the bucket label and each row's key hash (``hashes`` by join value)."""
    table = pa.concat_tables(
        [
            role_rows(roles.NEW, [dict(zip(STREAM, t, strict=True)) for t in new]),
            role_rows(
                roles.PARTITION,
                [dict(zip(MASTER, r, strict=True)) | {roles.VERSION: 0} for r in master],
            ),
        ]
    )
    key_of = [
        hashes[
            r[roles.stream_field("k")]
            if r[roles.ROLE] == roles.NEW
            else r[roles.master_field("mk")]
        ]
        for r in table.to_pylist()
    ]
    table = table.append_column(roles.BUCKET, pa.array([label] * table.num_rows, pa.int32()))
    return table.append_column(roles.KEY_HASH, pa.array(key_of, pa.int64()))


def test_a_bucket_sketches_its_new_keys_and_counts_only_the_tracked_ones() -> None:
    """With a sketch shape, a bucket reports an ASketch of its new tuples' key hashes
    (null join values left out: they match nothing) and gives counters only to the
    values whose hash is tracked; the answer does not depend on either."""
    layout = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))
    state, control = BucketState(), {"cache_version": None, "switch_version": None}
    # Step 0 of k = 1 starts an incrementing cycle: every pending value gets s_count.
    plan, _ = plan_for(0, 1, 1, 0, True, False, "paper", state, control, True)
    new = [(i, key) for i, key in enumerate([1, 1, 1, 2, 2, 3, None, None])]
    master = [(1, 0, 1.0), (2, 0, 2.0), (2, 1, 3.0)]
    table = hashed_bucket(new, master, {1: 101, 2: 202, 3: 303, None: 999}, label=7)
    arrow_plan = replace(plan, stream_key=layout.stream_key_positions)

    def run(tracked: list[int] | None) -> pa.Table:
        return bucket_step(
            table,
            BucketStep(layout, arrow_plan, BucketDeltas(), 4, None, tracked, SketchShape(2, 3, 64)),
        )

    exact, tracked = run(None), run([202])
    for result in (exact, tracked):
        rows = result.filter(pc.equal(result.column(roles.ROLE), roles.KEY_SKETCH)).to_pylist()
        assert [r[roles.BUCKET] for r in rows] == [7]
        sketch = ASketch.from_dict(json.loads(rows[0][roles.SKETCH]))
        assert sketch.added == 6  # the two null-key tuples are not counted
        assert dict(sketch.hot_keys()) == {101: 3, 202: 2}  # phi = 2: the two hottest
        assert sketch.estimate(303) >= 1
    assert of_role(exact, roles.COUNTER, [MASTER[0], roles.MASTER_ROWS, roles.OBSERVED]) == Counter(
        {(1, 1, 1): 1, (2, 2, 1): 1, (3, 0, 1): 1}
    )
    assert of_role(
        tracked, roles.COUNTER, [MASTER[0], roles.MASTER_ROWS, roles.OBSERVED]
    ) == Counter({(2, 2, 1): 1})
    assert (
        of_role(tracked, roles.METRIC_ROLE, [roles.METRIC, roles.VALUE])[("counter_rows", 1)] == 1
    )
    out = [*STREAM, *MASTER]
    assert of_role(exact, roles.OUT, out) == of_role(tracked, roles.OUT, out)


def test_a_split_keys_owner_weighs_the_whole_of_its_waiting_tuples() -> None:
    """A split key's tuples are spread evenly over its d buckets, so its owner holds 1/d of
    its H_S: line 33 must weigh d times the owner's share, or a key hot enough to split
    would rarely enter the cache. Three tuples of key 1 against three master rows
    (72 B < 120 B) do not switch it; as the owner's share of a key split two ways
    (144 B > 120 B) they do."""
    state = BucketState(counters={(1,): KeyCounters(master_rows=3, observed=1)})
    control = {"cache_version": 0, "switch_version": None}
    plan, reads = plan_for(1, 1, 5, 0, True, False, "paper", state, control, True)
    assert plan.position.state is CycleState.SWITCHING and plan.position.starts_cycle
    new = [(0, 1), (1, 1), (2, 1)]
    master = [(1, 0, 1.0), (1, 1, 2.0), (1, 2, 3.0)]
    partitions = {v: master for v in reads.partition_versions}

    def marked(spread: dict[tuple[int], int] | None) -> set[tuple[int, ...]]:
        fresh = BucketState(counters={(1,): KeyCounters(master_rows=3, observed=1)})
        return set(run_step(plan, fresh, new, partitions, spread=spread).state.switch_buffer)

    assert marked(None) == set()
    assert marked({(1,): 2}) == {(1,)}
    assert marked({(2,): 2}) == set()  # another key's spread changes nothing

    # The Arrow step gives the spread to the key's owner only.
    layout = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))
    table = pa.concat_tables(
        [
            role_rows(roles.NEW, [dict(zip(STREAM, t, strict=True)) for t in new]),
            role_rows(
                roles.COUNTER,
                [{MASTER[0]: 1, roles.HITS: 0, roles.MASTER_ROWS: 3, roles.OBSERVED: 1}],
            ),
            role_rows(
                roles.PARTITION,
                [dict(zip(MASTER, r, strict=True)) | {roles.VERSION: 0} for r in master],
            ),
        ]
    )
    table = table.append_column(roles.BUCKET, pa.array([7] * table.num_rows, pa.int32()))
    table = table.append_column(roles.KEY_HASH, pa.array([101] * table.num_rows, pa.int64()))
    arrow_plan = replace(plan, stream_key=layout.stream_key_positions)

    def marked_in(owner: int) -> Counter[Row]:
        out = bucket_step(
            table,
            BucketStep(layout, arrow_plan, BucketDeltas(), 4, {101: owner}, None, None, {101: 2}),
        )
        return of_role(out, roles.MARKED, [MASTER[0]])

    assert marked_in(owner=7) == Counter({(1,): 1})
    assert marked_in(owner=8) == Counter()  # a replica: neither decides nor keeps s_B


def test_partition_rows_no_tuple_asks_for_change_nothing_in_a_bucket() -> None:
    """Master partition rows whose key hash no new or pending tuple of the bucket has are
    dropped before the step (what the semi-join before the shuffle drops when the stage
    uses it): the output, state, counters and loads are those of the bucket without them,
    and a bucket of such rows alone yields nothing, as if it had received none."""
    layout = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))
    state, control = BucketState(), {"cache_version": None, "switch_version": None}
    plan, _ = plan_for(0, 1, 1, 0, True, False, "paper", state, control, True)
    arrow_plan = replace(plan, stream_key=layout.stream_key_positions)
    hashes = {1: 101, 2: 202, 4: 404, 5: 505}

    def bucket(new: list[tuple[int, int]], master: list[tuple[int, int, float]]) -> pa.Table:
        return hashed_bucket(new, master, hashes, label=3)

    asked = [(1, 0, 1.0), (2, 0, 2.0), (2, 1, 3.0)]
    unasked = [(4, 0, 4.0), (5, 0, 5.0), (5, 1, 6.0)]
    new = [(0, 1), (1, 2), (2, 2)]
    alone = bucket_step(bucket(new, asked), BucketStep(layout, arrow_plan, BucketDeltas(), 4))
    beside = bucket_step(
        bucket(new, asked + unasked), BucketStep(layout, arrow_plan, BucketDeltas(), 4)
    )

    assert Counter(map(tuple, (r.values() for r in beside.to_pylist()))) == Counter(
        map(tuple, (r.values() for r in alone.to_pylist()))
    )
    assert of_role(beside, roles.OUT, [STREAM[0], MASTER[1]]) == Counter(
        {(0, 0): 1, (1, 0): 1, (1, 1): 1, (2, 0): 1, (2, 1): 1}
    )
    only = bucket_step(bucket([], unasked), BucketStep(layout, arrow_plan, BucketDeltas(), 4))
    assert only.num_rows == 0 and only.schema == alone.schema


def test_s_count_is_read_at_the_switching_cycles_first_step_then_reset() -> None:
    """Line 33 reads s_count once, at the first step of the switching cycle, and nothing
    reads it until the next incrementing cycle counts it afresh: the decision still sees
    the counts (key 1 switches), and afterwards only values with hits keep counters,
    with s_count zero (key 2 keeps its hits, key 3 had only s_count and is gone)."""
    counted = {
        (1,): KeyCounters(master_rows=1, observed=1),
        (2,): KeyCounters(hits=2, master_rows=4, observed=1),
        (3,): KeyCounters(master_rows=9, observed=1),
    }
    state = BucketState(counters=dict(counted))
    control = {"cache_version": 0, "switch_version": None}
    plan, reads = plan_for(1, 1, 5, 0, True, False, "paper", state, control, True)
    assert plan.position.state is CycleState.SWITCHING and plan.position.starts_cycle
    new = [(0, 1), (1, 1), (2, 1)]
    partitions = {v: [(1, 0, 1.0)] for v in reads.partition_versions}
    result = run_step(plan, state, new, partitions)
    assert set(result.state.switch_buffer) == {(1,)}
    assert result.state.counters == {(2,): KeyCounters(hits=2)}
    assert result.counts.counter_rows == 1
