"""``enrich plan``: the cost models' recommendation from a stage's recorded steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from common.errors import EXIT_CONFIG, EXIT_OK, ConfigError
from jobs.enrich import main
from pipeline.config import parse_config
from pipeline.stage_plan import MIN_STEPS, SsbjPlan, ThetaStagePlan, describe, plan_stage
from tests.helpers import equi_stage, tiny_pipeline
from tests.pipeline.ssbj_harness import SsbjHarness
from warehouse.state_store import StateStore

MASTER = [(k, s, float(k + s)) for k in range(1, 41) for s in range(1 + k % 3)]


def test_ssbj_plan_fits_the_measured_steps_and_keeps_up_with_them(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h = SsbjHarness(spark, tmp_path, "ssbj", 3, 1, "inner")
    h.load_master(MASTER, files=6)
    for batch in range(MIN_STEPS + 2):
        h.arrive([(batch * 50 + i, (batch * 7 + i) % 45) for i in range(20 + 5 * batch)])
        if batch == 2:  # not enough steps yet: the plan says what it lacks
            early = plan_stage(h.config, h.store, "enrich")
            assert isinstance(early, SsbjPlan) and early.recommendation is None
            assert f"needs at least {MIN_STEPS}" in early.reason
        h.run(f"r{batch}")
    # One R-cycle of k steps scans every master row exactly once (b of Eq. 1-2).
    scanned = [
        m.value for m in h.store.metrics() if m.stage == "enrich" and m.name == "master_rows_read"
    ]
    assert sum(scanned[:3]) == len(MASTER)

    result = plan_stage(h.config, h.store, "enrich")
    assert isinstance(result, SsbjPlan)
    assert result.steps_measured == MIN_STEPS + 2 and result.master_rows == len(MASTER)
    assert 0.0 < result.cache_share <= 1.0 and result.arrival_rate > 0
    r = result.recommendation
    assert r is not None, result.reason
    # Eq. 4: the recommended configuration keeps up with the measured arrival rate.
    assert r.service_rate >= result.arrival_rate * (1 - 1e-9)
    assert 1 <= r.partitions <= len(MASTER) and r.steps_per_run >= 1 and r.memory_bytes > 0
    assert plan_stage(h.config, h.store, "enrich") == result  # same state, same plan

    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(h.config.model_dump(mode="json")))
    assert main(["--config", str(config), "plan", "enrich"]) == EXIT_OK
    printed = capsys.readouterr().out
    assert f"recommended: k = {r.partitions}" in printed and "step cost (Eq. 2)" in printed
    assert main(["--config", str(config), "plan", "no_such_stage"]) == EXIT_CONFIG


def test_baseline_stages_have_nothing_to_plan_and_theta_stages_show_their_scheme(
    tmp_path: Path,
) -> None:
    raw = tiny_pipeline(tmp_path, "k", "bigint") | {
        "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "lo", "hi"]}},
        "stages": [
            equi_stage(name="plain", output="o1", operator={"mode": "baseline"}),
            {
                "name": "band",
                "kind": "theta",
                "input": "s",
                "master": "m",
                "predicate": {"type": "range", "stream_column": "k", "lo": "lo", "hi": "hi"},
                "output": "o2",
            },
        ],
    }
    config = parse_config(raw)
    store = StateStore(config.warehouse.resolved_state_store())
    try:
        with pytest.raises(ConfigError, match=r"stages\.plain: a baseline stage"):
            plan_stage(config, store, "plain")
        fresh = plan_stage(config, store, "band")
        assert isinstance(fresh, ThetaStagePlan) and fresh.last_chosen is None
        store.record_metrics("r1", "band", 1, {"tuples_in": 5, "theta_scheme_binning": 1.0})
        store.record_metrics("r2", "band", 2, {"tuples_in": 5, "theta_scheme_adsp": 1.0})
        seen = plan_stage(config, store, "band")
        assert isinstance(seen, ThetaStagePlan)
        assert (seen.configured_scheme, seen.last_chosen, seen.steps_measured) == (
            "auto",
            "adsp",
            2,
        )
        assert "last chosen: adsp" in "\n".join(describe(seen))
    finally:
        store.dispose()
