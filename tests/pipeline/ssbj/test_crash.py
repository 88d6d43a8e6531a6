"""Kill an SSBJ step between its commits; the rerun ends where an uninterrupted run ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset, kill_harness_at
from tests.pipeline.ssbj_harness import (
    SsbjHarness,
    closing_harness,
    run_closing_scenario,
    run_scenario,
)

pytestmark = pytest.mark.slow

# A step commits twice (the output, then the operator state) and then completes in the
# state store: its commit boundaries are after the output and after the state. Before
# its plan, a step may sync the operator's scan copy to a new master version.
# k = 2: steps 0-1 incrementing, 2-3 switching (values marked at step 2), 4-5 phase-out
# (s_B moves into the cache at step 4).
CRASH_POINTS = [
    "ssbj.after_scan_sync:1",  # step 0: the scan copy of the master landed, no plan yet
    "ssbj.after_output:3",  # step 2, marking: output landed, the new state not yet
    "ssbj.before_complete:5",  # step 4, s_B into H_R: state landed, step not completed
]


@pytest.fixture(scope="module")
def reference(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SsbjHarness:
    h = SsbjHarness(spark, tmp_path_factory.mktemp("reference"), "ssbj", 2, 1, "left")
    run_scenario(h)
    h.drain()
    return h


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_killed_step_reruns_to_the_uninterrupted_result(
    spark: SparkSession, tmp_path: Path, reference: SsbjHarness, crash_at: str
) -> None:
    kill_harness_at("tests.pipeline.ssbj_harness", tmp_path, crash_at, REPO_ROOT)

    resumed = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left")
    run_scenario(resumed)
    resumed.drain()
    assert_same_multiset(resumed.output(), reference.output())
    assert_same_multiset(resumed.output(), reference.oracle("left"))
    assert_same_multiset(resumed.cache_rows(), reference.cache_rows())
    assert resumed.operator().pending_rows() == 0


# Each closing run takes two steps, the second its closing step: run 0's closing step is
# the 2nd step, run 1's the 4th.
CLOSING_CRASH_POINTS = ["ssbj.after_output:2", "ssbj.before_complete:4"]


@pytest.mark.parametrize("crash_at", CLOSING_CRASH_POINTS)
def test_a_run_killed_in_its_closing_steps_reruns_to_every_tuple_answered_once(
    spark: SparkSession, tmp_path: Path, crash_at: str
) -> None:
    kill_harness_at("tests.pipeline.ssbj_harness", tmp_path, crash_at, REPO_ROOT, args=["closing"])
    resumed = closing_harness(spark, tmp_path)
    run_closing_scenario(resumed)
    assert resumed.operator().pending_rows() == 0  # no drain: each run closed its tuples
    assert_same_multiset(resumed.output(), resumed.oracle("left"))
