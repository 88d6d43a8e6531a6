"""SSBJ / MESHJOIN stages are exact and point-in-time, checked against DuckDB."""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

from common.errors import JoinError
from joins.skew.asketch import ASketch, SketchShape
from joins.ssbj.cache.inequality import should_switch_into_cache
from joins.ssbj.roles import BUCKET
from joins.ssbj.step import SCAN_PART, SEGMENT, JoinSpec, scan_rows
from joins.ssbj.wide_table import WideTable
from pipeline.handles import PipelineHandles
from pipeline.runner import PipelineRunner
from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import SsbjHarness

pytestmark = pytest.mark.slow


def zipf_keys(rng: random.Random, domain: list[int], z: float, n: int) -> list[int]:
    weights = [1 / (r + 1) ** z for r in range(len(domain))]
    return rng.choices(domain, weights=weights, k=n)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(["ssbj", "meshjoin"]),
    how=st.sampled_from(["inner", "left"]),
    partitions=st.integers(1, 3),
    steps=st.integers(1, 2),
    z=st.sampled_from([0.0, 1.0, 1.5]),
)
def test_drained_output_equals_oracle_per_pinned_version(
    spark: SparkSession, seed: int, mode: str, how: str, partitions: int, steps: int, z: float
) -> None:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as folder:
        h = SsbjHarness(spark, Path(folder), mode, partitions, steps, how)
        # duplicate keys (many-to-many) and keys 900+ that match nothing
        master = [
            (k, s, float(rng.randint(1, 99))) for k in range(1, 9) for s in range(rng.randint(0, 3))
        ]
        h.load_master(master, files=rng.randint(1, 4))
        domain = [*range(1, 9), 900, 901]
        for run in range(5):
            h.arrive_keys(zipf_keys(rng, domain, z, rng.randint(0, 8)))
            if run == 2:  # a master update between steps: upsert, new row, delete
                h.update_master([(1, 0, -5.0), (3, 7, 3.5)], [(2, 0)])
            h.run()
        h.drain()
        assert h.operator().pending_rows() == 0
        assert_same_multiset(h.output(), h.oracle(how))


def test_stage_equals_oracle_on_the_native_engine(spark: SparkSession, tmp_path: Path) -> None:
    """One fixed case of the oracle test above through the native engine (delta-spark).

    The oracle test above runs on the embedded engine, as every pipeline test does.

    Skewed keys (z = 1) so that the cache takes hot keys, many-to-many master rows, keys
    that match nothing, and a master merge (upsert, new row, delete) between steps, which
    the stage follows through the change data feed of that engine's commit.
    """
    rng = random.Random(11)
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left", engine="native")
    h.load_master([(k, s, float(10 * k + s)) for k in range(1, 9) for s in range(k % 3 + 1)], 2)
    domain = [*range(1, 9), 900]
    # Two runs (the second after the merge) and the drain: each delta-spark commit costs
    # about a second here, and the embedded oracle test above covers longer histories.
    for run in range(2):
        h.arrive_keys(zipf_keys(rng, domain, 1.0, 6))
        if run == 1:
            h.update_master([(1, 0, -5.0), (3, 7, 3.5)], [(2, 0)])
        h.run()
    h.drain()
    assert h.operator().pending_rows() == 0
    assert_same_multiset(h.output(), h.oracle("left"))


@pytest.mark.parametrize("collect_rows", [1_000_000, 0], ids=["arrow", "spark"])
def test_hot_key_switches_into_cache_and_pending_tuples_complete_once(
    spark: SparkSession, tmp_path: Path, collect_rows: int
) -> None:
    """``arrow``: each step's result is collected and written from the driver (the default
    for small steps); ``spark``: it stays in Spark, persisted, and Spark jobs write it."""
    operator = {"collect_rows": collect_rows}
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "inner", operator=operator)
    # key 1: one master row, three tuples per run (cheaper in the cache);
    # key 5: six master rows, one tuple per run (cheaper pending in H_S)
    h.load_master([(1, 0, 1.0), *[(5, s, 5.0 + s) for s in range(6)]], files=2)
    for _ in range(8):  # cycles: steps 0-1 incrementing, 2-3 switching, 4-5 phase-out, 6-7 ...
        h.arrive_keys([1, 1, 1, 5])
        h.run()
    h.drain()
    assert_same_multiset(h.output(), h.oracle("inner"))
    assert h.cached_keys() == {1}
    sizes = h.measured_sizes()
    # at the switching decision H_S holds two chunks: 6 tuples of key 1, 2 of key 5
    assert should_switch_into_cache(6, 1, sizes)
    assert not should_switch_into_cache(2, 6, sizes)
    assert h.metric_sum("cache_hits") > 0  # key-1 tuples after the phase-out hit the cache
    # every tuple produced exactly its matches: 1 per key-1 tuple, 6 per key-5 tuple
    assert len(h.output()) == 8 * (3 * 1 + 1 * 6)
    # s_B: key 1's master row is collected in the switching cycle and moves into H_R at
    # the phase-out's first step (4); the state counts it beside H_R's rows while held.
    by_step: dict[int, dict[str, float]] = {}
    for m in h.store.metrics():
        if m.stage == "enrich":
            by_step.setdefault(m.step - 1, {})[m.name] = m.value  # metrics count from 1
    assert by_step[3]["switch_rows"] == 1 and by_step[4]["switch_rows"] == 0
    assert max(by_step[s]["switch_rows"] for s in (0, 1, 4, 5)) == 0
    b = 7 / 2  # Eq. 1's disk buffer: the master's rows over k
    for values in by_step.values():
        held = b + values["cache_rows"] + values["switch_rows"]
        assert values["state_bytes"] == pytest.approx(
            held * sizes.master_bytes + values["pending_rows"] * sizes.stream_bytes
        )


@pytest.mark.parametrize("rows_per_tuple", [0, 10**9], ids=["semi-join", "buckets-drop"])
def test_floating_join_values_meet_as_in_spark_and_duckdb(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows_per_tuple: int
) -> None:
    """A double join key: NaN meets NaN and -0.0 meets 0.0 (Spark's and DuckDB's equality),
    through the bucket hash, the partition rows no tuple asks for dropped (by the semi-join
    before the shuffle, or in each bucket), the disk phase and the cache (the disk phase is
    MESHJOIN's, so this covers that mode too); null meets nothing."""
    monkeypatch.setattr("pipeline.ssbj.placement.SEMI_JOIN_ROWS_PER_TUPLE", rows_per_tuple)
    nan = float("nan")
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left", key_type="double")
    h.load_master(
        [(nan, 0, 1.0), (nan, 1, 2.0), (0.0, 0, 3.0), (-0.0, 1, 4.0), (1.5, 0, 5.0)], files=2
    )
    for _ in range(6):  # past the first phase-out: the hot NaN key is served from H_R
        h.arrive_keys([nan, nan, nan, -0.0, 0.0, 1.5, None, 7.0])
        h.run()
    h.drain()
    out = h.output()
    assert_same_multiset(out, h.oracle("left"))
    nan_matches = [r for r in out if r[2] is not None and r[2] != r[2]]
    assert len(nan_matches) == 6 * 3 * 2  # every NaN tuple met both NaN rows
    assert h.metric_sum("cache_hits") > 0


def test_a_run_with_nothing_to_do_takes_no_step_and_the_cache_catches_up_after(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Nothing pending and no new input: no Spark pass, no commit, the step counter stays.
    The master changes during the pause; the first step after it brings the cache forward,
    so a cached key's tuples join the new row."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "inner")
    h.load_master([(1, 0, 1.0), *[(5, s, 5.0 + s) for s in range(6)]], files=2)
    for _ in range(6):
        h.arrive_keys([1, 1, 1, 5])
        h.run()
    h.drain()
    assert h.cached_keys() == {1}
    stage = h.operator()
    assert stage.idle(take_input=True)

    def versions() -> tuple[int, int, int]:
        state = h.store.operator_state("enrich")
        assert state is not None
        return (
            state["next_step"],
            h.engine.snapshot(h.paths_of("state")).version,
            h.engine.snapshot(h.layout.staged("out")).version,
        )

    paused = versions()
    h.run()
    h.run()
    assert versions() == paused
    hits = h.metric_sum("cache_hits")

    h.update_master([(1, 0, 99.0)], [])
    h.arrive_keys([1, 1])
    assert not stage.idle(take_input=True)
    h.run()
    h.drain()
    assert versions()[0] > paused[0]
    assert h.metric_sum("cache_hits") == hits + 2  # served by the cache, at the new price
    assert_same_multiset(h.output(), h.oracle("inner"))


@pytest.mark.parametrize("change", ["overwrite", "append"])
def test_master_changed_without_change_feed_refreshes_the_cache(
    spark: SparkSession, tmp_path: Path, change: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A master without a change feed changes under the stage: the stage keeps joining.

    Keys 1, 6 and 7 (no rows yet) are cached before the change. ``overwrite``, another
    writer's full refresh, changes the rows of keys 1 and 5, drops key 6 and adds key 7: the
    cache reads the tracked values again. ``append`` adds rows of keys 1 and 7: the cache
    takes them from the added files' rows (no reload). Tuples pinned before the change
    join the old rows, later ones the new rows, cache hits included.
    """
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "inner")
    before = [(1, 0, 1.0), *[(5, s, 5.0 + s) for s in range(6)], (6, 0, 6.0)]
    h.load_master(before, files=2, change_feed=False)

    def arrive_and_run(runs: int) -> None:
        for _ in range(runs):
            h.arrive_keys([1, 1, 1, 5, 6, 7])
            h.run()

    arrive_and_run(6)  # past the phase-out: keys 1, 6 and 7 (no rows) are in the cache
    assert h.cached_keys() == {1, 6, 7}
    if change == "overwrite":
        h.refresh_master(
            [(1, 0, 100.0), (1, 1, 101.0), *[(5, s, 50.0) for s in range(3)], (7, 0, 7.0)]
        )
    else:
        added = [(1, 1, 11.0), (7, 0, 7.0), (7, 1, 7.5)]
        h.engine.append(h.master, spark.createDataFrame(added, h.master_schema))
    with caplog.at_level(logging.INFO, logger="pipeline.ssbj"):
        arrive_and_run(2)
    h.drain()
    assert_same_multiset(h.output(), h.oracle("inner"))
    assert h.metric_sum("cache_hits") > 0
    reloaded = "without a change feed" in caplog.text
    assert reloaded == (change == "overwrite"), caplog.text
    if change == "append":
        assert {(1, 1, 11.0), (7, 0, 7.0), (7, 1, 7.5)} <= {r[:3] for r in h.cache_rows()}


def test_cache_entries_without_hits_are_evicted_in_a_run_and_the_output_stays_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Algorithm 1's eviction (lines 42-49) inside pipeline runs: with k = 2 and E = 4 the
    cache fills at step 4 (the phase-out of cycle 3) and the eviction pass runs at step 6
    (the start of cycle 4). Keys 1, 6 and 7 stop arriving once they are cached, so they have
    no hits by then and leave the cache; key 1's later tuples are answered from the disk
    phase, and every tuple still meets each of its matches once (DuckDB oracle)."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left", operator={"eviction_cycles": 4})
    h.load_master([(1, 0, 1.0), *[(5, s, 5.0 + s) for s in range(6)]], files=2)

    def arrive_and_run(keys: list[int]) -> None:
        h.arrive_keys(keys)
        h.run()

    for _ in range(4):  # steps 0-3: keys 1, 6 and 7 are counted and marked
        arrive_and_run([1, 1, 1, 5, 6, 7])
    for _ in range(2):  # steps 4-5: cached, and not asked for
        arrive_and_run([5, 900])
    assert h.cached_keys() == {1, 6, 7}
    arrive_and_run([5, 900])  # step 6: the eviction pass
    assert not h.cached_keys() & {1, 6, 7}
    arrive_and_run([1, 1, 6])  # from the disk phase again
    h.drain()
    assert_same_multiset(h.output(), h.oracle("left"))


@pytest.mark.parametrize("collect_fails", [False, True], ids=["driver-read", "both"])
def test_a_result_the_driver_cannot_take_stays_in_spark_and_the_output_stays_exact(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    collect_fails: bool,
) -> None:
    """A step whose rows the driver cannot read and lay out (an Arrow or memory error)
    collects them with a Spark job instead; one whose collect fails too (as one over
    ``spark.driver.maxResultSize`` does) runs its buckets in Spark tasks and keeps its
    result there. Nothing is written twice or lost."""

    collect = ClassicDataFrame.toArrow

    def too_big(self: ClassicDataFrame) -> Any:
        if BUCKET in self.columns:  # a step's rows; other collects (row sizes) go through
            raise PySparkException(message="serialized results bigger than maxResultSize")
        return collect(self)

    def out_of_memory(*_: Any) -> Any:
        raise MemoryError("the step's rows do not fit")

    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left")
    h.load_master([(1, 0, 1.0), (2, 0, 2.0), (2, 1, 2.5)], files=1)
    monkeypatch.setattr(WideTable, "keyed_rows_arrow", out_of_memory)
    if collect_fails:
        monkeypatch.setattr(ClassicDataFrame, "toArrow", too_big)
    with caplog.at_level(logging.WARNING, logger="pipeline.ssbj"):
        for run in range(3):
            h.arrive([(run * 3, 1), (run * 3 + 1, 2), (run * 3 + 2, 9)])
            h.run()
        h.drain()
    assert "reading the step's rows in the driver failed" in caplog.text
    assert ("collecting the step's rows failed" in caplog.text) == collect_fails
    assert "it runs in Spark this step" in caplog.text
    monkeypatch.undo()
    assert_same_multiset(h.output(), h.oracle("left"))


def test_meshjoin_mode_never_caches(spark: SparkSession, tmp_path: Path) -> None:
    h = SsbjHarness(spark, tmp_path, "meshjoin", 2, 2, "left")
    h.load_master([(1, 0, 1.0)], files=1)
    for run in range(4):
        h.arrive([(run * 3 + i, 1) for i in range(3)])
        h.run()
    h.drain()
    assert_same_multiset(h.output(), h.oracle("left"))
    assert h.metric_sum("cache_hits") == 0
    assert h.cached_keys() == set()


def test_memory_budget_admits_the_backlog_a_chunk_at_a_time(
    spark: SparkSession, tmp_path: Path
) -> None:
    """operator.memory_bytes = M (Eq. 1): every step's state fits M, the rest waits.

    MESHJOIN mode, so every admitted tuple enters H_S (miss rate 1) and the admission is
    exact: with b = 4 master rows per partition, M leaves room for 6 pending tuples, k = 2
    chunks of w_S = 3, so the five input versions of 3 tuples enter one per step.
    """
    master = [(k, s, float(k + s)) for k in range(1, 5) for s in range(2)]
    probe = SsbjHarness(spark, tmp_path / "probe", "meshjoin", 2, 1, "inner")
    probe.load_master(master, files=1)
    probe.arrive([(0, 1), (1, 2), (2, 3)])
    probe.run()
    sizes = probe.measured_sizes()  # v_S and v_R as the stage measures them
    budget = int(4 * sizes.master_bytes + 6.5 * sizes.stream_bytes)

    h = SsbjHarness(
        spark, tmp_path / "run", "meshjoin", 2, 1, "inner", operator={"memory_bytes": budget}
    )
    h.load_master(master, files=1)
    for batch in range(5):
        h.arrive([(batch * 3 + i, 1 + (batch + i) % 5) for i in range(3)])
    h.run()
    stage = h.operator()
    assert stage.pending_rows() == 3
    assert h.store.offset("enrich").input_version == 1  # bronze v1 of v1..v5
    for run in range(4):
        h.run(f"more{run}")
    h.drain()
    assert h.store.offset("enrich").input_version == 5
    assert_same_multiset(h.output(), h.oracle("inner"))
    by_name: dict[str, list[float]] = {}
    for m in h.store.metrics():
        by_name.setdefault(m.name, []).append(m.value)
    assert max(by_name["state_bytes"]) <= budget
    assert max(by_name["pending_rows"]) == 3  # after each step's expiry; 6 during it
    assert by_name["backlog_rows"][:5] == [12, 9, 6, 3, 0]
    assert set(by_name["memory_bytes"]) == {budget}
    # The master is one file; the scan copy still gives both partitions rows to read.
    assert min(by_name["master_bytes_read"]) > 0
    assert min(by_name["step_seconds"]) > 0  # the step's own time, recorded with it


def test_scan_partitions_hold_a_kth_of_the_rows_whatever_the_file_layout(
    spark: SparkSession,
) -> None:
    """hash(row) mod k: within 5% of |R|/k for a skewed many-to-many master."""
    spec = JoinSpec(("k",), ("mk",), ("mk", "v"), "m", "inner")
    rows = [(i % 7 if i % 3 else i, i) for i in range(10_000)]  # key 0..6 hold 2/3 of rows
    master = spark.createDataFrame(rows, "mk bigint, v bigint").coalesce(1)
    parts = scan_rows(master, spec, 4).groupBy(SCAN_PART).count().collect()
    sizes = sorted(r["count"] for r in parts)
    assert len(sizes) == 4 and sum(sizes) == 10_000
    assert max(abs(n - 2_500) for n in sizes) <= 125


def test_state_of_an_earlier_release_with_tuples_pending_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Operator state from the release that kept H_S in its own table: nothing is read or
    changed while tuples wait there; with nothing pending the stage carries on, its step
    numbering (the output's app transactions) continued."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "inner")
    h.load_master([(1, 0, 1.0)], files=1)
    earlier = {"next_step": 7, "cycle_base": 0, "partitions": 2, "chunks": {"6": 1}}
    h.store.save_operator_state("enrich", earlier)
    stage = h.operator()
    with pytest.raises(JoinError, match=r"earlier release .* 1 chunk\(s\) .*`enrich drain`"):
        stage.step("r1", take_input=True)
    assert h.store.operator_state("enrich") == earlier

    h.store.save_operator_state("enrich", {**earlier, "chunks": {}})
    h.arrive([(1, 1), (2, 1)])
    h.run()
    h.drain()
    assert_same_multiset(h.output(), h.oracle("inner"))
    state = h.store.operator_state("enrich")
    assert state is not None and state["next_step"] == 9  # steps 7 and 8 (the drain)


def test_a_key_sketch_bounds_the_counters_and_the_output_stays_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``key_counts: sketch``: the buckets sketch their new tuples' keys, the driver merges
    the sketches (saved in the operator state) and only the values in its filter get
    counters and can enter the cache. Against exact counting over the same arrivals, with
    many one-off keys beside two hot ones and a master update mid-run: both outputs are
    the DuckDB oracle's whole multiset, the hot values are still cached, and far fewer
    counter rows are kept."""
    rng = random.Random(9)
    arrivals = []
    next_id = 0
    for _ in range(6):
        keys = [rng.choice([1, 2]) for _ in range(8)] + [
            rng.randrange(100, 10_000) for _ in range(8)
        ]
        arrivals.append([(next_id + i, k) for i, k in enumerate(keys)])
        next_id += len(keys)
    master = [(k, s, float(10 * k + s)) for k in [1, 2, *range(100, 400)] for s in range(k % 2 + 1)]
    counters = {}
    for counting in ("exact", "sketch"):
        operator = {"key_counts": counting, "sketch_keys": 2, "sketch_width": 64}
        h = SsbjHarness(spark, tmp_path / counting, "ssbj", 2, 1, "left", operator=operator)
        h.load_master(master, 2)
        for run, batch in enumerate(arrivals):
            h.arrive(batch)
            if run == 2:
                h.update_master([(1, 0, -5.0), (150, 9, 3.5)], [(2, 0)])
            h.run()
        h.drain()
        assert_same_multiset(h.output(), h.oracle("left"))
        assert h.metric_sum("cache_hits") > 0, counting
        counters[counting] = h.metric_sum("counter_rows")
        tracked = [m.value for m in h.store.metrics() if m.name == "tracked_keys"]
        state = h.store.operator_state("enrich")
        assert state is not None
        if counting == "sketch":
            assert 0 < max(tracked) <= 2
            sketch = ASketch.from_dict(state["key_sketch"])
            assert sketch.shape == SketchShape(2, 4, 64)  # (empty: the drain added nothing)
            assert h.metric_sum("sketch_bytes") > 0
        else:
            assert max(tracked) == 0 and "key_sketch" not in state
    assert counters["sketch"] * 3 < counters["exact"], counters


@pytest.mark.parametrize(
    ("method", "split", "ways"),
    [
        ("greedyfit", None, None),
        ("safit", None, None),
        ("greedyfit", 1.0, None),
        ("greedyfit", 1.0, 2),
    ],
)
def test_keys_move_between_buckets_while_tuples_wait_and_the_output_stays_exact(
    spark: SparkSession, tmp_path: Path, method: str, split: float | None, ways: int | None
) -> None:
    """FastJoin's migration in the operator: with Theta = 1 the monitor moves keys after
    almost every step, keys whose tuples wait in H_S (k = 2) or whose rows sit in H_R, across
    a master update. With ``split`` the hottest keys are also split over several buckets
    (replicas answer their share from copies of the cache and the partition). Every tuple
    still meets each of its matches once (DuckDB oracle, whole multiset), and keys did move
    with stored rows (and were split). With ``ways`` = 2 (STA's two choices) a split key
    spreads over its owner and one replica, never more."""
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "4")  # 4 key buckets
    try:
        rng = random.Random(5)
        operator = {
            "rebalance": method,
            "rebalance_threshold": 1.0,
            "rebalance_keys": 3,
            "split_hot_keys": split,
            "split_ways": ways,
        }
        h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left", operator=operator)
        h.load_master([(k, s, float(10 * k + s)) for k in range(1, 13) for s in range(k % 3)], 2)
        domain = [*range(1, 13), 900]
        replicas: list[int] = []  # each split key's replica count, after every run
        routing: dict = {}  # of the next step, as the last one left it
        # the cache fills at step 4 (phase-out, k = 2): runs after it meet replicas' copies
        for run in range(8 if split else 6):
            had_split_keys = bool(routing.get("split"))
            h.arrive_keys(zipf_keys(rng, domain, 1.5, 12))
            if run == 2:
                h.update_master([(1, 0, -5.0), (4, 9, 3.5)], [(2, 0)])
            h.run()
            state = h.store.operator_state("enrich") or {}
            # A step with split keys leaves a value's counters once per replica: the next
            # step must merge them (``StepPlan.one_row_per_value``), and knows it.
            assert state["replica_rows"] == had_split_keys, run
            routing = state.get("routing") or {}
            replicas += [len(r) for _, r in routing.get("split", [])]
        h.drain()
        moved = [m for m in h.store.metrics() if m.stage == "enrich" and m.name == "moved_keys"]
        assert sum(m.value for m in moved if m.value) > 0, "no key moved: the test proves nothing"
        assert_same_multiset(h.output(), h.oracle("left"))
        assert h.metric_sum("moved_tuples") > 0
        assert max(m.value for m in h.store.metrics() if m.name == "routed_keys") > 0
        splits = [m.value for m in h.store.metrics() if m.name == "split_keys"]
        assert (max(splits) > 0) == (split is not None)
        if split is not None:
            assert h.metric_sum("cache_hits") > 0  # replicas answered from their copies
            assert replicas, "no key was split: the test proves nothing"
        if ways is not None:
            assert max(replicas) == ways - 1, replicas
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous or "2")


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_step_writes_the_segments_that_changed_and_a_cold_process_goes_on_exactly(
    spark: SparkSession, tmp_path: Path, how: str
) -> None:
    """The state table is partitioned by segment (``joins.ssbj.step``): once H_S holds
    several chunks, a step writes its new chunk (and the shared segments), not H_S, and
    holds the new state for its next step; a new process (a new runner, nothing held)
    reads the segments back and goes on to the oracle's output."""
    rng = random.Random(5)
    h = SsbjHarness(spark, tmp_path, "meshjoin", 4, 1, how)
    h.load_master([(k, s, float(10 * k + s)) for k in range(1, 9) for s in range(k % 3)], 2)
    for run in range(7):
        if run == 4:  # a cold process: the runner's drivers and warm caches are new
            h.runner = PipelineRunner(PipelineHandles(h.config, spark, h.engine, h.store))
        h.arrive_keys(zipf_keys(rng, [*range(1, 9), 900], 1.0, 6))
        h.run()
    state_path = h.paths_of("state")
    assert h.engine.snapshot(state_path).partition_columns == (SEGMENT,)
    metrics = sorted(h.store.metrics(), key=lambda m: m.step)
    written = [m.value for m in metrics if m.name == "state_rows_written"]
    pending = [m.value for m in metrics if m.name == "pending_rows"]
    assert written[0] == pending[0] == 6
    assert all(p > 12 for p in pending[3:]), pending
    if how == "inner":
        # From the fourth step H_S holds 3-4 chunks of 6 tuples; a step writes its own.
        assert all(w == 6 for w in written[3:]), (written, pending)
    else:
        # A left join's chunks change when their tuples first match: those are
        # rewritten too, the others not.
        assert any(6 <= w < p for w, p in zip(written[3:], pending[3:], strict=True)), written
    h.drain()
    assert_same_multiset(h.output(), h.oracle(how))


def test_a_state_table_of_an_earlier_release_stays_whole_and_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A state table created without segments (before they existed) is rewritten whole
    by every step, as it was, and the output stays the oracle's."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 3, 1, "inner")
    h.load_master([(k, s, float(10 * k + s)) for k in range(1, 7) for s in range(k % 3)], 1)
    h.arrive([(i, 1 + i % 6) for i in range(8)])
    h.run()
    # Lay the state table out as an earlier release did: the same rows, no segments.
    state_path = h.paths_of("state")
    rows = DeltaTable(state_path).to_pyarrow_table()
    shutil.rmtree(state_path)
    whole = rows.drop_columns([SEGMENT])
    write_deltalake(state_path, whole)
    controller = h.store.operator_state("enrich")
    assert controller is not None
    controller.pop("segments")
    h.store.save_operator_state("enrich", controller)
    h.runner = PipelineRunner(PipelineHandles(h.config, spark, h.engine, h.store))
    for run in range(3):
        h.arrive([(100 + 10 * run + i, 1 + (run + i) % 6) for i in range(5)])
        h.run()
    assert h.engine.snapshot(state_path).partition_columns == ()
    h.drain()
    assert_same_multiset(h.output(), h.oracle("inner"))
