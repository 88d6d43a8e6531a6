"""The warm pipeline worker (``enrich --worker``): real worker processes on a Unix socket."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable

from common.errors import EXIT_CONFIG, EXIT_ERROR, EXIT_OK
from jobs.worker import SOCKET_DIR_ENV, worker_key, worker_socket
from tests.conftest import REPO_ROOT
from tests.helpers import assert_imports_none_of, tiny_pipeline

STARTED = re.compile(r"pipeline worker (\d+) on ")


def enrich(config: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.enrich", "--config", str(config), *argv],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def land(folder: Path, name: str, first_id: int, rows: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"id": first_id + i, "k": i % 3, "ts": "2024-01-01T00:00:00Z"})
        for i in range(rows)
    ]
    (folder / name).write_text("\n".join(lines) + "\n")


def worker_pids(config: Path) -> list[int]:
    log = worker_socket(config).with_suffix(".log")
    return [int(pid) for pid in STARTED.findall(log.read_text())] if log.exists() else []


def test_commands_run_in_one_warm_worker_with_their_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO_ROOT)  # where the commands run: the worker's key depends on it
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(tiny_pipeline(tmp_path, "k", "bigint")))
    land(tmp_path / "landing", "a.json", 0, 5)

    first = enrich(config, "--worker", "ingest", "--run-id", "r1")
    assert first.returncode == EXIT_OK, first.stderr[-3000:]
    # The worker's log records are re-emitted by the client, so a task log shows them.
    assert "task ingest of run r1 took" in first.stderr
    status = enrich(config, "--worker", "status", "--json")
    assert status.returncode == EXIT_OK, status.stderr[-3000:]
    assert [run["run_id"] for run in json.loads(status.stdout)["last_runs"]] == ["r1/ingest"]
    # Each command runs with its client's environment: another state store is empty.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    elsewhere = enrich(config, "--worker", "status", "--json", ENRICH_STATE_STORE=other)
    assert elsewhere.returncode == EXIT_OK, elsewhere.stderr[-3000:]
    assert json.loads(elsewhere.stdout)["last_runs"] == []
    # Exit codes cross the socket: a bad stage name is a configuration error.
    bad = enrich(config, "--worker", "stage", "no_such_stage")
    assert bad.returncode == EXIT_CONFIG
    assert "no stage named 'no_such_stage'" in bad.stderr
    # The client reads only the global options; the worker parses the rest and says why.
    typo = enrich(config, "--worker", "ingest", "--run-idd", "r9")
    assert typo.returncode == 2, typo.stderr[-3000:]
    assert "unrecognized arguments: --run-idd" in typo.stderr
    assert len(worker_pids(config)) == 1, "every command should have reused the worker"

    # A command that kills the worker fails like a task process that died; the next
    # command starts a new worker, and the file is loaded exactly once.
    land(tmp_path / "landing", "b.json", 100, 4)
    crashed = enrich(
        config, "--worker", "ingest", "--run-id", "r2", ENRICH_CRASH_AT="delta.before_commit"
    )
    assert crashed.returncode == EXIT_ERROR
    assert "the pipeline worker ended while running `enrich" in crashed.stderr
    again = enrich(config, "--worker", "ingest", "--run-id", "r3")
    assert again.returncode == EXIT_OK, again.stderr[-3000:]
    pids = worker_pids(config)
    assert len(pids) == 2 and pids[0] != pids[1], pids
    bronze = DeltaTable(str(tmp_path / "wh" / "bronze" / "s")).to_pyarrow_table(columns=["id"])
    assert sorted(bronze.column("id").to_pylist()) == [*range(5), *range(100, 104)]

    stopped = enrich(config, "worker", "--stop")
    assert stopped.returncode == EXIT_OK and "worker stopped" in stopped.stdout
    assert not worker_socket(config).exists()
    assert "no worker was running" in enrich(config, "worker", "--stop").stdout


def test_an_idle_worker_exits(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump(tiny_pipeline(tmp_path, "k", "bigint")))
    socket = tmp_path / "w.sock"
    started = time.monotonic()
    done = enrich(config, "worker", "--socket", str(socket), "--idle-timeout", "1")
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    assert "idle for" in done.stderr
    assert time.monotonic() - started < 60
    assert not socket.exists()


def test_worker_key_follows_what_shapes_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text("name: a\n")
    base = {"PATH": "/bin", "SPARK_MASTER": "local[2]"}
    key = worker_key(config, None, base, tmp_path)
    # Per-command settings do not pick another worker.
    assert worker_key(config, None, {**base, "ENRICH_STATE_STORE": "sqlite://"}, tmp_path) == key
    assert worker_key(config, None, {**base, "AIRFLOW_CTX_TASK_ID": "x"}, tmp_path) == key
    # Nor do the variables pyspark sets in a process that started Spark itself.
    assert worker_key(config, None, {**base, "PYSPARK_PYTHON": "/x/python"}, tmp_path) == key
    # The session's settings, the master, the working directory and the config do.
    assert worker_key(config, None, {**base, "SPARK_MASTER": "local[4]"}, tmp_path) != key
    assert worker_key(config, "local[4]", base, tmp_path) != key
    assert worker_key(config, None, base, tmp_path / "..") != key
    config.write_text("name: b\n")
    assert worker_key(config, None, base, tmp_path) != key
    monkeypatch.setenv(SOCKET_DIR_ENV, str(tmp_path / "sockets"))
    assert worker_socket(config).parent == tmp_path / "sockets"


def test_a_config_the_worker_cannot_load_is_a_config_error(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.yaml"
    config.write_text("name: t\nstreams: {}\nno_such_key: 1\n")
    done = enrich(config, "--worker", "status")
    assert done.returncode == EXIT_CONFIG, done.stderr[-3000:]
    assert "no_such_key" in done.stderr


def test_a_worker_client_imports_nothing_heavy() -> None:
    """A DAG task's process only relays its command to the worker: it imports neither
    Spark, GX, Delta nor SQLAlchemy (0.3 s of every task's start, through logging set-up),
    nor the CLI's parser (the worker parses the command)."""
    assert_imports_none_of(
        "import jobs.enrich, jobs.worker\n"
        "from jobs.worker_request import worker_request\n"
        "request = worker_request(['--config', 'c.yaml', '--worker', 'stage', 's'])\n"
        "assert request is not None\n"
        "from common.command_logging import configure_command_logging\n"
        "configure_command_logging(request.log_level, jobs.enrich.PACKAGE_LOGGERS)",
        (
            "pyspark",
            "great_expectations",
            "deltalake",
            "sqlalchemy",
            "duckdb",
            "jobs.cli",
            "rich_argparse",
        ),
        REPO_ROOT,
    )
