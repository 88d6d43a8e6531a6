"""``enrich status``'s data: the streams' ledgers, the stages' lag and each output's
intervals (complete, waiting, overdue), without Spark."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from common.errors import EXIT_OK
from jobs.enrich import main
from pipeline.config import load_config, parse_config
from pipeline.handles import PipelineHandles
from pipeline.runner import PipelineRunner
from pipeline.status import pipeline_status
from tests.helpers import tiny_pipeline
from tests.pipeline.ssbj_harness import config_for
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.state_completeness import IntervalRecord
from warehouse.state_store import StateStore


def test_status_lists_rejected_files_still_in_place(spark: SparkSession, tmp_path: Path) -> None:
    config = parse_config(tiny_pipeline(tmp_path, "k", "bigint"))
    store = StateStore(config.warehouse.resolved_state_store())
    runner = PipelineRunner(PipelineHandles(config, spark, EmbeddedDeltaEngine(spark), store))
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


def completeness_records(config_file: Path) -> None:
    """Two intervals of ``out`` (bound 2 intervals): the first complete, the second with
    half its tuples waiting since 2024, so long past its bound."""
    start = datetime(2024, 1, 1, tzinfo=UTC)
    hour = timedelta(hours=1)
    store = StateStore(load_config(config_file).warehouse.resolved_state_store())
    try:
        store.save_completeness(
            [
                IntervalRecord("out", start, start + hour, 8, 0, 0, None, True,
                               start + 2 * hour, "r2", "r2"),
                IntervalRecord("out", start + hour, start + 2 * hour, 10, 4, 1,
                               start + 2 * hour, False, None, None, "r2"),
            ],
            ("completeness.out", {"counted_version": 2}),
            ("completeness.out", {}),
        )  # fmt: skip
    finally:
        store.dispose()


def test_status_json_shows_each_outputs_intervals_and_the_overdue_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        yaml.safe_dump(config_for(tmp_path, "ssbj", 2, 1, "left").model_dump(mode="json"))
    )
    assert main(["--config", str(config_file), "status", "--json"]) == EXIT_OK
    empty = json.loads(capsys.readouterr().out)["completeness"]
    assert empty == {
        "out": {
            "freshness_bound": "2 intervals (2h)",
            "intervals": [],
            "oldest_waiting": None,
            "overdue": 0,
        }
    }
    completeness_records(config_file)
    assert main(["--config", str(config_file), "status", "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)["completeness"]["out"]
    newest, oldest = shown["intervals"]  # newest first
    assert newest["interval_start"].startswith("2024-01-01 01:00:00")
    assert (newest["tuples"], newest["waiting"], newest["quarantined"]) == (10, 4, 1)
    assert (newest["share_answered"], newest["complete"], newest["overdue"]) == (0.5, False, True)
    assert (oldest["share_answered"], oldest["complete"], oldest["overdue"]) == (1.0, True, False)
    assert oldest["completed_run_id"] == "r2"
    assert shown["overdue"] == 1
    assert shown["oldest_waiting"]["interval_start"].startswith("2024-01-01 01:00:00")
    assert shown["oldest_waiting"]["entered_at"].startswith("2024-01-01 02:00:00")


def test_status_tables_show_each_interval_and_flag_the_overdue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per row
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(
        yaml.safe_dump(config_for(tmp_path, "ssbj", 2, 1, "left").model_dump(mode="json"))
    )
    completeness_records(config_file)
    assert main(["--config", str(config_file), "status"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "intervals per output" in out
    rows = [line for line in out.splitlines() if "2024-01-01 0" in line]
    assert len(rows) == 2, out
    assert "out" in rows[0] and "within 2 intervals (2h)" in out
    assert "50.0%" in rows[0] and "4 +1 quarantined" in rows[0] and "no, OVERDUE" in rows[0]
    assert "100.0%" in rows[1] and "yes" in rows[1] and "OVERDUE" not in rows[1]
