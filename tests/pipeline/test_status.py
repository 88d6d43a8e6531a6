"""``enrich status``'s data: the streams' ledgers and the stages' lag, without Spark."""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from pipeline.config import parse_config
from pipeline.runner import PipelineRunner
from pipeline.status import pipeline_status
from tests.helpers import tiny_pipeline
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.state_store import StateStore


def test_status_lists_rejected_files_still_in_place(spark: SparkSession, tmp_path: Path) -> None:
    config = parse_config(tiny_pipeline(tmp_path, "k", "bigint"))
    store = StateStore(config.warehouse.resolved_state_store())
    runner = PipelineRunner(config, spark, EmbeddedDeltaEngine(spark), store)
    landing = Path(config.streams["s"].landing)
    landing.mkdir(parents=True)
    (landing / "drift.json").write_text(json.dumps({"id": 1, "zzz": 2}) + "\n")
    store.start_run("r1", "ingest")
    runner.ingest("r1")
    stream = pipeline_status(config, store)["streams"]["s"]
    assert stream["files_rejected"] == 1
    (rejected,) = stream["rejected_in_place"]
    assert rejected["path"] == str(landing / "drift.json") and "zzz" in rejected["reason"]
    (landing / "drift.json").unlink()
    assert pipeline_status(config, store)["streams"]["s"]["rejected_in_place"] == []
