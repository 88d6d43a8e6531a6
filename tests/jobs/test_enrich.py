"""The enrich CLI: exit codes, status and report on a small pipeline."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from common.errors import EXIT_BUSY, EXIT_CONFIG, EXIT_OK
from jobs.cli import build_parser, parse_args
from jobs.enrich import main
from pipeline.config import load_config
from pipeline.layout import WarehouseLayout
from reports.html_report import PLOT_IDS
from tests.conftest import REPO_ROOT
from tests.helpers import tiny_pipeline
from tests.pipeline.ssbj_harness import config_for
from warehouse.lease import LeaseSettings, PipelineLease
from warehouse.state_store import StateStore
from warehouse.state_tables import REJECTED


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
    capsys.readouterr()
    bad_time = ["--config", str(broken), "backfill", "--start", "yesterday", "--end", "today"]
    assert main(bad_time) == EXIT_CONFIG
    assert "expected an ISO-8601 timestamp, got 'yesterday'" in capsys.readouterr().err
    # A log level that does not exist is refused before anything runs, naming the choices.
    assert main(["--log-level", "verbose", "--config", str(broken), "status"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--log-level" in err and "'VERBOSE'" in err and "DEBUG" in err and "Traceback" not in err


def test_master_on_the_command_line_reaches_the_job() -> None:
    args, _ = parse_args(["--master", "spark://h:7077", "status"])
    assert args.master == "spark://h:7077"
    assert parse_args(["status"])[0].master is None  # then SPARK_MASTER, then the config


def test_every_command_and_option_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help for choice in commands._choices_actions}
    assert set(summaries) == set(commands.choices)
    undocumented = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in [("enrich", parser), *commands.choices.items()]
        for action in sub._actions
        if not action.help and not isinstance(action, argparse._SubParsersAction)
    ]
    assert undocumented == []
    assert all(summaries.values()), summaries
    assert main(["--help"]) == EXIT_OK
    top = capsys.readouterr().out
    assert all(name in top for name in commands.choices) and "exit codes" in top
    assert "``" not in top  # reST markup of the module docstring does not leak into help
    for name in commands.choices:
        assert main([name, "--help"]) == EXIT_OK
        assert summaries[name].split()[0] in capsys.readouterr().out
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out.strip() == f"enrich {metadata.version('stream-enrichment')}"


def test_status_prints_tables_of_streams_stages_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # wide enough that no path folds inside its cell
    config = tmp_path / "pipeline.yaml"  # one stream s, one equi stage enrich -> out
    pipeline = config_for(tmp_path, "ssbj", 2, 1, "inner")
    config.write_text(yaml.safe_dump(pipeline.model_dump(mode="json")))
    (tmp_path / "landing").mkdir()
    bad = tmp_path / "landing" / "broken.json"
    bad.write_text("{")
    store = StateStore(load_config(config).warehouse.resolved_state_store())
    try:
        store.register_landing_file("s", str(bad), 1, "0" * 64, "r1", status=REJECTED, error="bad")
        store.start_run("r1/ingest", "scheduled")
        store.finish_run("r1/ingest", error="exit code 4")
        store.start_run("r2/ingest", "scheduled")
    finally:
        store.dispose()
    assert main(["--log-level", "debug", "--config", str(config), "status"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "{" not in out  # tables, not Python reprs
    for title in ("streams", "rejected files still in the landing zone", "stages", "last runs"):
        assert title in out
    assert "broken.json" in out and "exit code 4" in out
    assert "r2/ingest" in out and "running" in out
    stage_row = next(line for line in out.splitlines() if "enrich" in line and "v0" in line)
    assert "out" in stage_row


def test_run_status_and_report(
    spark: SparkSession, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(REPO_ROOT / "configs" / "demo.yaml")
    assert main(["--config", config, "demo-data", "--scale", "0.01", "--intervals", "1"]) == EXIT_OK
    landing = workdir / "var" / "demo" / "landing" / "orders"
    landing.mkdir(parents=True)
    outbox = workdir / "var" / "demo" / "outbox" / "orders" / "0000"
    first = sorted(outbox.glob("*.json"))[0]
    (landing / first.name).write_bytes(first.read_bytes())
    assert main(["--config", config, "ingest", "--run-id", "r1"]) == EXIT_OK
    capsys.readouterr()
    # Each commit names the command and run that made it, for anyone reading the history.
    layout = WarehouseLayout.of(load_config(Path(config)))
    bronze = layout.bronze("orders")
    assert DeltaTable(bronze).history(1)[0]["enrichment.run"] == "ingest r1"
    # Tables the pipeline creates checkpoint every warehouse.checkpoint_interval commits; the
    # demo masters feed their changes to the SSBJ cache through the change data feed.
    assert DeltaTable(bronze).metadata().configuration["delta.checkpointInterval"] == "10"
    master = layout.master(load_config(Path(config)), "customer")
    assert DeltaTable(master).metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert main(["--config", config, "status", "--json"]) == EXIT_OK
    status = json.loads(capsys.readouterr().out)
    assert status["streams"]["orders"]["files_loaded"] == 1
    assert status["stages"]["orders_customer"]["versions_behind"] == 1
    assert main(["--config", config, "report"]) == EXIT_OK
    printed = capsys.readouterr().out.split("report: ")[1]
    report = Path(printed.split(" (")[0])
    assert printed.strip().endswith("(1 run(s))")
    html = report.read_text()
    assert html.count("<svg") == len(PLOT_IDS) and "Run report: demo" in html
    runs = html.split("id='runs'>", 1)[1].split("</table>", 1)[0]
    assert "<td>r1</td>" in runs and "succeeded" in runs
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
    spark: SparkSession, workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
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
