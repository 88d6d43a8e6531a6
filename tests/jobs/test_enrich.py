"""The enrich CLI: exit codes, status and report on a small pipeline."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from common.errors import EXIT_BUSY, EXIT_CONFIG, EXIT_OK
from jobs.enrich import main
from pipeline.config import load_config
from tests.conftest import REPO_ROOT
from tests.helpers import tiny_pipeline
from warehouse.lease import LeaseSettings, PipelineLease
from warehouse.state_store import StateStore


def test_bad_arguments_and_config_exit_with_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "--config",
                str(REPO_ROOT / "configs" / "demo.yaml"),
                "backfill",
                "--start",
                "2024-01-02",
                "--end",
                "2024-01-01",
            ]
        )
        == EXIT_CONFIG
    )
    assert "must be before" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nstreams: {}\n")
    assert main(["--config", str(broken), "status"]) == EXIT_CONFIG
    with pytest.raises(SystemExit) as info:
        main(["--config", str(broken), "backfill", "--start", "yesterday", "--end", "today"])
    assert info.value.code == 2


def test_run_status_and_report(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    config = str(REPO_ROOT / "configs" / "demo.yaml")
    assert main(["--config", config, "demo-data", "--scale", "0.01", "--intervals", "1"]) == EXIT_OK
    landing = tmp_path / "var" / "demo" / "landing" / "orders"
    landing.mkdir(parents=True)
    outbox = tmp_path / "var" / "demo" / "outbox" / "orders" / "0000"
    first = sorted(outbox.glob("*.json"))[0]
    (landing / first.name).write_bytes(first.read_bytes())
    assert main(["--config", config, "ingest", "--run-id", "r1"]) == EXIT_OK
    capsys.readouterr()
    assert main(["--config", config, "status", "--json"]) == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert status["streams"]["orders"]["files_loaded"] == 1
    assert status["stages"]["orders_customer"]["versions_behind"] == 1
    assert main(["--config", config, "report"]) == EXIT_OK
    printed = capsys.readouterr().out.split("report: ")[1]
    report = Path(printed.split(" (")[0])
    assert printed.strip().endswith("(1 run(s))")
    html = report.read_text()
    assert html.count("<svg") == 6 and "Run report: demo" in html
    # The ingest task's timings: the phases it went through add up to its wall time.
    store = StateStore(load_config(Path(config)).warehouse.resolved_state_store())
    try:
        timed = {m.name: m.value for m in store.metrics("r1") if m.stage == "task.ingest"}
    finally:
        store.dispose()
    assert timed["seconds.total"] > 0 and timed["seconds.write"] > 0, timed
    phases = sum(v for k, v in timed.items() if k != "seconds.total")
    assert phases == pytest.approx(timed["seconds.total"], rel=1e-6)
    assert "<td>r1</td><td>ingest</td>" in html.split("id='task-timings'>", 1)[1]


def test_a_second_writer_waits_for_or_is_refused_the_lease(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.chdir(tmp_path)
    config = str(REPO_ROOT / "configs" / "demo.yaml")
    assert main(["--config", config, "demo-data", "--scale", "0.01", "--intervals", "1"]) == EXIT_OK
    store = StateStore(load_config(Path(config)).warehouse.resolved_state_store())
    holder = PipelineLease(store, "demo", "run other", LeaseSettings(ttl_seconds=30))
    holder.acquire()
    # Another run holds the lease: a writer exits 5 naming it, a reader is not held up.
    assert main(["--config", config, "ingest", "--run-id", "r1"]) == EXIT_BUSY
    assert "is busy: run other holds its lease" in caplog.text
    assert main(["--config", config, "status"]) == EXIT_OK
    # With --wait the writer takes the lease once the holder lets go of it.
    threading.Timer(2.0, holder.release).start()
    assert main(["--config", config, "--wait", "60", "ingest", "--run-id", "r1"]) == EXIT_OK
    assert main(["--config", config, "--wait", "-1", "ingest"]) == EXIT_CONFIG


def test_status_and_bad_stage_names_answer_without_spark(tmp_path: Path) -> None:
    # A fresh interpreter: no Spark session may exist when these commands return.
    script = (
        "import sys\n"
        "from jobs.enrich import main\n"
        "codes = [main(sys.argv[1:3] + ['status', '--json']),"
        " main(sys.argv[1:3] + ['stage', 'no_such_stage'])]\n"
        "from pyspark.sql import SparkSession\n"
        "assert SparkSession.getActiveSession() is None, 'a Spark session was started'\n"
        "print(codes)\n"
    )
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(tiny_pipeline(tmp_path, "k", "bigint")))
    done = subprocess.run(
        [sys.executable, "-c", script, "--config", str(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"[{EXIT_OK}, {EXIT_CONFIG}]"
    assert "no stage named 'no_such_stage'" in done.stderr
