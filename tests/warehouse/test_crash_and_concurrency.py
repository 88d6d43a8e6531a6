"""Writers killed mid-write, and several writer processes racing on one table."""

from __future__ import annotations

import json
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
from tests.warehouse.append_worker import SCHEMA
from warehouse.delta.embedded import EmbeddedDeltaEngine

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
    )


def parquet_files(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*.parquet")}


def test_writer_killed_before_commit_leaves_table_unchanged(
    spark: SparkSession, tmp_path: Path
) -> None:
    engine = EmbeddedDeltaEngine(spark)
    table = tmp_path / "t"
    engine.create_table(str(table), SCHEMA)

    killed = run_worker(table, "w", 0, 50, 1, crash_at="delta.before_commit")
    _, stderr = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, stderr.decode()[-2000:]
    orphans = parquet_files(table)
    assert orphans, "the worker should have written Parquet before it was killed"
    assert engine.snapshot(str(table)).version == 0
    assert engine.read(str(table)).count() == 0

    for _ in range(2):  # the rerun commits; a second rerun finds the transaction and skips
        rerun = run_worker(table, "w", 0, 50, 1)
        assert rerun.wait(timeout=300) == 0
    assert engine.snapshot(str(table)).version == 1
    assert_same_multiset(engine.read(str(table)), [(i, "w") for i in range(50)])

    deleted = engine.vacuum(str(table), retention_hours=0)
    assert orphans - parquet_files(table) == orphans
    assert len(deleted) >= len(orphans)
    assert_same_multiset(engine.read(str(table)), [(i, "w") for i in range(50)])


def test_concurrent_writers_land_every_row_exactly_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    engine = EmbeddedDeltaEngine(spark)
    table = tmp_path / "t"
    engine.create_table(str(table), SCHEMA)
    writers, rows, batches = 3, 40, 3
    procs = [
        run_worker(table, f"writer{w}", w * rows * batches, rows, batches) for w in range(writers)
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


def test_processes_racing_on_one_app_transaction_land_it_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two processes run the same step (same app id and version) and commit at the same time.

    A barrier in the commit guard makes both commit from version 0, so one of them loses to
    the other's commit of the same app transaction; the loser must say it did not commit.
    """
    engine = EmbeddedDeltaEngine(spark)
    table = tmp_path / "t"
    engine.create_table(str(table), SCHEMA)
    barrier = f"{tmp_path / 'barrier'}:2"
    procs = {
        label: run_worker(
            table, "step", 0, 30, 1, "--label", label, "--barrier", barrier, capture=True
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
