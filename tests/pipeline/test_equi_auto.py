"""``mode: auto`` for equi stages, through the runner, against DuckDB.

The choice follows the Delta logs' sizes, then the measured costs per tuple of each mode's
steps (the plain join measured once first); switching between SSBJ and the plain join keeps
every tuple answered exactly once: leaving SSBJ drains its pending tuples first, and SSBJ
resumes its step numbering above the plain join's (the output's app transactions).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pipeline.baseline_driver import EquiBaselineDriver
from pipeline.handles import PipelineHandles
from pipeline.runner import PipelineRunner
from pipeline.ssbj.driver import SsbjDrainingDriver, SsbjDriver
from pipeline.ssbj.state import held_back
from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import SsbjHarness, config_for

# Thresholds that make any master "large" for auto, so that it picks SSBJ, and one that
# makes the test's master "small".
SSBJ_ALWAYS = {"ssbj_above_bytes": 0, "ssbj_master_batches": 0.001}
SMALL_MASTER = {"ssbj_above_bytes": 1024**3}
MASTER = [(k, s, float(10 * k + s)) for k in range(1, 7) for s in range(1 + k % 3)]


def reconfigure(h: SsbjHarness, root: Path, how: str, operator: dict[str, Any]) -> None:
    """The same warehouse under a changed config, as the next command would load it."""
    h.config = config_for(root, "auto", 2, 1, how, operator=operator)
    h.runner = PipelineRunner(PipelineHandles(h.config, h.spark, h.engine, h.store))


@pytest.mark.parametrize("how", ["inner", "left"])
def test_auto_joins_a_small_master_whole_and_says_why(
    spark: SparkSession, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    h = SsbjHarness(spark, tmp_path, "auto", 2, 1, how, operator=SMALL_MASTER)
    h.load_master(MASTER, files=2)
    h.arrive([(0, 1), (1, 2), (2, 2), (3, 99), (4, 5)])
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert isinstance(h.runner.driver(h.config.stage("enrich")), EquiBaselineDriver)
    assert "auto chose baseline" in caplog.text and "ssbj_above_bytes" in caplog.text
    h.run()
    h.arrive([(5, 3), (6, 3), (7, 6)])
    h.run()
    assert_same_multiset(h.output(), h.oracle(how))
    # The counts the step observed while writing (one job) agree with the oracle.
    metrics = {m.name: 0.0 for m in h.store.metrics()}
    for m in h.store.metrics():
        if m.stage == "enrich":
            metrics[m.name] += m.value
    assert metrics["tuples_in"] == 8
    assert metrics["tuples_unmatched"] == 1  # key 99
    assert metrics["output_rows"] == len(h.oracle(how))


def next_command(h: SsbjHarness) -> None:
    """The next command on the same warehouse: its registry decides ``auto`` anew."""
    h.runner = PipelineRunner(PipelineHandles(h.config, h.spark, h.engine, h.store))


def test_auto_measures_the_plain_join_once_then_picks_ssbj_for_a_large_master(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = SsbjHarness(spark, tmp_path, "auto", 2, 1, "left", operator=SSBJ_ALWAYS)
    h.load_master(MASTER, files=2)
    h.arrive([(0, 1), (1, 4)])
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert type(h.runner.driver(h.config.stage("enrich"))) is EquiBaselineDriver
    assert "the plain join was not measured on this stage yet" in caplog.text
    h.run()
    next_command(h)
    h.arrive([(2, 2)])
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert type(h.runner.driver(h.config.stage("enrich"))) is SsbjDriver
    assert "measured over its first R-cycle (2 steps)" in caplog.text
    h.run()
    h.drain()
    assert_same_multiset(h.output(), h.oracle("left"))
    # The first SSBJ step created the scan copy and says what that took of its seconds,
    # which the measured choice leaves out (pipeline/mode_costs.py); no later step did.
    ssbj_steps: dict[int, dict[str, float]] = {}
    for m in h.store.metrics():
        if m.stage == "enrich":
            ssbj_steps.setdefault(m.step, {})[m.name] = m.value
    ssbj_steps = {n: v for n, v in ssbj_steps.items() if "cache_hits" in v}
    first, *later = sorted(ssbj_steps)
    assert later, "the drain ran SSBJ steps after the first"
    created = ssbj_steps[first].get("scan_created_seconds", 0.0)
    assert 0.0 < created <= ssbj_steps[first]["step_seconds"]
    assert all("scan_created_seconds" not in ssbj_steps[n] for n in later)


def plant_steps(h: SsbjHarness, mode: str, steps: int, seconds: float, tuples: int) -> None:
    """Step metrics as the runner records them: an SSBJ step counts its cache hits."""
    for step in range(steps):
        values = {"step_seconds": seconds, "tuples_in": float(tuples)}
        if mode == "ssbj":
            values["cache_hits"] = 0.0
        h.store.record_metrics(f"{mode}-run", "enrich", step + 1, values)


@pytest.mark.parametrize(("ssbj_seconds", "expected"), [(5.0, "baseline"), (0.05, "ssbj")])
def test_auto_weighs_the_measured_costs_per_tuple(
    spark: SparkSession,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    ssbj_seconds: float,
    expected: str,
) -> None:
    h = SsbjHarness(spark, tmp_path, "auto", 2, 1, "left", operator=SSBJ_ALWAYS)
    h.load_master(MASTER, files=2)
    h.arrive([(0, 1)])
    plant_steps(h, "baseline", 1, 0.5, 100)  # 5 ms a tuple
    plant_steps(h, "ssbj", 2, ssbj_seconds, 100)  # a whole R-cycle of k = 2
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        driver = h.runner.driver(h.config.stage("enrich"))
    assert isinstance(driver, SsbjDriver if expected == "ssbj" else EquiBaselineDriver)
    assert "measured: SSBJ" in caplog.text and "the plain join 5000.0 us over 1" in caplog.text


def test_switching_between_ssbj_and_the_plain_join_answers_every_tuple_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = SsbjHarness(spark, tmp_path, "auto", 2, 1, "left", operator=SSBJ_ALWAYS)
    h.load_master(MASTER, files=2)
    h.arrive([(0, 1), (1, 2), (2, 2), (3, 99)])
    h.run()  # the plain join, measured once
    next_command(h)
    h.arrive([(4, 3), (5, 4)])
    h.run()
    assert h.operator().pending_rows() > 0  # SSBJ holds tuples when the master "shrinks"

    reconfigure(h, tmp_path, "left", SMALL_MASTER)  # the master is "small": the plain join
    assert isinstance(h.runner.driver(h.config.stage("enrich")), SsbjDrainingDriver)
    h.arrive([(6, 5), (7, 6), (8, 1)])
    h.run()  # drains H_S with SSBJ, new tuples included
    assert held_back(h.store.operator_state("enrich")) is None
    h.arrive([(9, 2), (10, 77)])
    h.runner = PipelineRunner(
        PipelineHandles(h.config, h.spark, h.engine, h.store)
    )  # the next command
    assert isinstance(h.runner.driver(h.config.stage("enrich")), EquiBaselineDriver)
    h.run()

    reconfigure(h, tmp_path, "left", SSBJ_ALWAYS)  # and back: SSBJ after plain steps
    h.arrive([(11, 3), (12, 3), (13, 4)])
    h.run()
    h.drain()
    assert_same_multiset(h.output(), h.oracle("left"))


def test_auto_at_a_bound_of_one_interval_joins_whole_and_says_why(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """k = 2 steps a run over k = 2 partitions: the harness's bound is one interval, where a
    cycle ends within each run, so even thresholds that always pick SSBJ give the plain join."""
    h = SsbjHarness(spark, tmp_path, "auto", 2, 2, "left", operator=SSBJ_ALWAYS)
    assert h.config.stage("enrich").freshness.complete_within == "1 intervals"
    h.load_master(MASTER, files=2)
    h.arrive([(0, 1), (1, 4)])
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert isinstance(h.runner.driver(h.config.stage("enrich")), EquiBaselineDriver)
    assert "auto chose baseline" in caplog.text and "freshness bound" in caplog.text
