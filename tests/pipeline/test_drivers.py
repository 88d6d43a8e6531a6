"""The driver registry: which driver runs a stage, and the mode change it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from common.errors import ConfigError
from pipeline.baseline_driver import EquiBaselineDriver
from pipeline.drivers import driver_kind
from pipeline.ssbj.driver import SsbjDriver
from tests.pipeline.ssbj_harness import SsbjHarness, config_for


@pytest.mark.parametrize(
    ("mode", "kind"), [("ssbj", "ssbj"), ("meshjoin", "ssbj"), ("baseline", "baseline")]
)
def test_driver_kind_follows_the_operator_mode(tmp_path: Path, mode: str, kind: str) -> None:
    config = config_for(tmp_path, mode, 2, 1, "inner")
    assert driver_kind(config.stage("enrich")) == kind


def test_leaving_ssbj_while_tuples_wait_is_refused_until_a_drain(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Tuples waiting in H_S would never be emitted by a driver that keeps none: the move
    is a config error naming the way out, and is accepted once a drain has emptied H_S."""
    ssbj = SsbjHarness(spark, tmp_path, "meshjoin", 2, 1, "inner")
    ssbj.load_master([(1, 0, 1.0), (2, 0, 2.0)], files=1)
    ssbj.arrive([(0, 1), (1, 2), (2, 3)])
    ssbj.run()
    assert ssbj.operator().pending_rows() == 3  # MESHJOIN: every tuple waits a cycle

    baseline = SsbjHarness(spark, tmp_path, "baseline", 2, 1, "inner")
    stage = baseline.config.stage("enrich")
    with pytest.raises(ConfigError, match=r"stages\.enrich: .*3 tuple\(s\) wait in H_S.*drain"):
        baseline.runner.driver(stage)
    with pytest.raises(ConfigError):
        baseline.runner.run_stage_step(stage, "r2")

    ssbj.drain()
    assert isinstance(ssbj.runner.driver(ssbj.config.stage("enrich")), SsbjDriver)
    assert isinstance(baseline.runner.driver(stage), EquiBaselineDriver)
