"""Kill an SSBJ step between its commits; the rerun ends where an uninterrupted run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from common.faults import CRASH_ENV_VAR
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset
from tests.joins.ssbj_harness import SsbjHarness, run_scenario

pytestmark = pytest.mark.slow

# k = 2: steps 0-1 incrementing, 2-3 switching (marked values written at step 2),
# 4-5 phase-out (cache written at step 4), 6 incrementing.
# ssbj.after_pending (only the H_S chunk landed) is left out to keep CI under 20 minutes:
# its rerun skips the same kind of app-transaction write the points below cover.
CRASH_POINTS = [
    "ssbj.after_output:3",  # step 2: output landed, stats/marked not yet
    "ssbj.after_stats:4",  # step 3: counters and switching buffer landed, expiry not yet
    "ssbj.after_cache:5",  # step 4: cache overwritten, expiry not yet
    "ssbj.before_complete:6",  # step 5: every table written, state store not updated
]


@pytest.fixture(scope="module")
def reference(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> SsbjHarness:
    h = SsbjHarness(spark, tmp_path_factory.mktemp("reference"), "ssbj", 2, 1, "left")
    run_scenario(h)
    h.drain()
    return h


def cache_rows(h: SsbjHarness) -> list[tuple]:
    return [tuple(r) for r in h.engine.read(h.paths_of("cache")).collect()]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
def test_killed_step_reruns_to_the_uninterrupted_result(
    spark: SparkSession, tmp_path: Path, reference: SsbjHarness, crash_at: str
) -> None:
    env = {**os.environ, CRASH_ENV_VAR: crash_at}
    killed = subprocess.run(
        [sys.executable, "-m", "tests.joins.ssbj_harness", str(tmp_path)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]

    resumed = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left")
    run_scenario(resumed)
    resumed.drain()
    assert_same_multiset(resumed.output(), reference.output())
    assert_same_multiset(resumed.output(), reference.oracle("left"))
    assert_same_multiset(cache_rows(resumed), cache_rows(reference))
    assert resumed.runner.ssbj_stage(resumed.config.stage("enrich")).pending_rows() == 0
