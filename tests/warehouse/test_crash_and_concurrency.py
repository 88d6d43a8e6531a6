"""Writers killed mid-write, and several writer processes racing on one table, on both
Delta engines (the worker process: tests/warehouse/append_worker.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from common.faults import CRASH_ENV_VAR
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset
from tests.warehouse.append_worker import SCHEMA
from tests.warehouse.delta.test_engines import ENGINES, make_engine
from warehouse.delta import AppTransaction

pytestmark = pytest.mark.slow


def run_worker(
    *args: object, crash_at: str | None = None, capture: bool = False
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV_VAR}
    if crash_at:
        env[CRASH_ENV_VAR] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "tests.warehouse.append_worker", *map(str, args)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: the JVM dies with it on a kill
    )


def parquet_files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*.parquet")}


def kill_when_held(worker: subprocess.Popen[bytes], marker: Path) -> None:
    """SIGKILL the worker's whole process group once its write is held mid-way."""
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert worker.poll() is None, worker.communicate()[1].decode()[-3000:]
        assert time.monotonic() < deadline, "the worker never reached the middle of its write"
        time.sleep(0.1)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.communicate(timeout=60)


@pytest.mark.parametrize(
    ("engine_name", "kill"),
    [
        # embedded: its data files are written, the log commit is not made
        ("embedded", "delta.before_commit"),
        # native: delta-spark writes and commits in one call; killed while it writes
        ("native", "mid-write"),
        # killed right after the commit landed, before the caller heard of it (a rerun
        # skipping a landed app transaction is the same code for both engines: the racing
        # test below runs it on each)
        ("embedded", "delta.after_commit"),
    ],
)
def test_writer_killed_mid_commit_reruns_to_exactly_once(
    spark: SparkSession, tmp_path: Path, engine_name: str, kill: str
) -> None:
    engine = make_engine(spark, engine_name)
    table = tmp_path / "t"
    engine.create_table(str(table), SCHEMA)
    rows = [(i, "w") for i in range(50)]

    if kill == "mid-write":
        marker = tmp_path / "held"
        killed = run_worker(table, "w", 0, 50, 1, "--engine", engine_name, "--hold", marker)
        kill_when_held(killed, marker)
    else:
        killed = run_worker(table, "w", 0, 50, 1, "--engine", engine_name, crash_at=kill)
        _, stderr = killed.communicate(timeout=300)
        assert killed.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    landed = kill == "delta.after_commit"
    live = {f.path for f in engine.snapshot(str(table)).files}
    orphans = parquet_files(table) - live
    if landed:
        assert engine.snapshot(str(table)).version == 1
        assert_same_multiset(engine.read(str(table)), rows)
    else:
        assert orphans, "the worker should have written Parquet before it was killed"
        assert engine.snapshot(str(table)).version == 0
        assert engine.read(str(table)).count() == 0

    # The rerun, a process of its own, commits unless the killed run's commit landed; the
    # same batch again (here, in this process: a writer's app transaction is the table's,
    # not the process's) skips.
    rerun = run_worker(table, "w", 0, 50, 1, "--engine", engine_name, capture=True)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr.decode()[-3000:]
    outcome = json.loads(stdout.decode().strip().splitlines()[-1])
    assert outcome["committed"] is not landed, outcome
    assert outcome["table_version"] == 1, outcome
    again = engine.append(str(table), spark.createDataFrame(rows, SCHEMA), AppTransaction("w", 0))
    assert not again.committed and again.table_version == 1
    assert engine.snapshot(str(table)).version == 1
    assert_same_multiset(engine.read(str(table)), rows)

    deleted = engine.vacuum(str(table), retention_hours=0)
    assert orphans - parquet_files(table) == orphans
    assert len(deleted) >= len(orphans)
    assert_same_multiset(engine.read(str(table)), rows)


@pytest.mark.parametrize("engine_name", ENGINES)
def test_concurrent_writers_land_every_row_exactly_once(
    spark: SparkSession, tmp_path: Path, engine_name: str
) -> None:
    engine = make_engine(spark, engine_name)
    table = tmp_path / "t"
    engine.create_table(str(table), SCHEMA)
    writers, rows, batches = 3, 40, 3
    procs = [
        run_worker(table, f"writer{w}", w * rows * batches, rows, batches, "--engine", engine_name)
        for w in range(writers)
    ]
    for proc in procs:
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr.decode()[-3000:]
    expected = [
        (i, f"writer{w}")
        for w in range(writers)
        for i in range(w * rows * batches, (w + 1) * rows * batches)
    ]
    assert_same_multiset(engine.read(str(table)), expected)
    assert engine.snapshot(str(table)).version == writers * batches
    for w in range(writers):
        assert engine.transaction_version(str(table), f"writer{w}") == batches - 1


@pytest.mark.parametrize("engine_name", ENGINES)
def test_processes_racing_on_one_app_transaction_land_it_once(
    spark: SparkSession, tmp_path: Path, engine_name: str
) -> None:
    """Two processes run the same step (same app id and version) and commit at the same time.

    A barrier in the commit guard makes both commit from version 0, so one of them loses to
    the other's commit of the same app transaction; the loser must say it did not commit.
    """
    engine = make_engine(spark, engine_name)
    table = tmp_path / "t"
    engine.create_table(str(table), SCHEMA)
    barrier = f"{tmp_path / 'barrier'}:2"
    procs = {
        label: run_worker(
            table,
            "step",
            0,
            30,
            1,
            "--engine",
            engine_name,
            "--label",
            label,
            "--barrier",
            barrier,
            capture=True,
        )
        for label in ("w0", "w1")
    }
    outcomes = {}
    for label, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr.decode()[-3000:]
        outcomes[label] = json.loads(stdout.decode().strip().splitlines()[-1])
    winners = [label for label, outcome in outcomes.items() if outcome["committed"]]
    assert len(winners) == 1, outcomes
    assert {o["table_version"] for o in outcomes.values()} == {1}
    assert engine.snapshot(str(table)).version == 1
    assert engine.transaction_version(str(table), "step") == 0
    assert_same_multiset(engine.read(str(table)), [(i, winners[0]) for i in range(30)])
