"""Writers racing on one Delta table in the object store (a real S3 server on loopback).

Pipeline commands commit through delta-rs there, which puts each commit file with
``If-None-Match: *``: of two writers that try the same version, the store lets one win and
the other retries on the next. Checked with the writer processes of the local concurrency
tests (tests/warehouse/append_worker.py) beside a master writer that is plain delta-rs, and
with two processes committing the same app transaction from the same version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession

from tests.conftest import REPO_ROOT
from tests.object_store_server import S3Server
from tests.warehouse.append_worker import SCHEMA
from warehouse.delta import open_engine
from warehouse.delta.api import AppTransaction, PartitionFilter
from warehouse.delta.schema import spark_to_arrow
from warehouse.object_store import ObjectStore
from warehouse.spark import use_object_store

pytestmark = pytest.mark.slow

# A master writer: plain delta-rs appends, as a team's own job would write a master table.
MASTER_WRITER = """
import sys
import pyarrow as pa
from deltalake import write_deltalake
from warehouse.object_store import ObjectStore
table, first, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
options = ObjectStore.from_environment().delta_options()
for b in range(batches):
    ids = list(range(first + 10 * b, first + 10 * (b + 1)))
    rows = pa.table({"id": pa.array(ids, pa.int64()), "writer": ["master"] * len(ids)})
    write_deltalake(table, rows, mode="append", storage_options=options)
"""


def start(args: list[object], environment: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *map(str, args)],
        cwd=REPO_ROOT,
        env={**os.environ, **environment},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def finished(proc: subprocess.Popen[bytes]) -> list[str]:
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    return stdout.decode().strip().splitlines()


def test_pipeline_writers_and_a_master_writer_lose_no_commit(
    spark: SparkSession, s3_server: S3Server, s3_bucket: str
) -> None:
    environment = s3_server.environment()
    table = f"s3://{s3_bucket}/racing"
    options = ObjectStore.from_environment(environment).delta_options()
    write_deltalake(
        table,
        pa.Table.from_pylist([], schema=spark_to_arrow(SCHEMA)),
        storage_options=options,
    )
    writers, rows, batches, master_batches = 2, 20, 3, 6
    procs = [
        start(
            ["-m", "tests.warehouse.append_worker", table, f"w{w}", w * 1000, rows, batches],
            environment,
        )
        for w in range(writers)
    ]
    procs.append(start(["-c", MASTER_WRITER, table, "100000", str(master_batches)], environment))
    for proc in procs:
        finished(proc)
    landed = DeltaTable(table, storage_options=options)
    found = sorted((r["id"], r["writer"]) for r in landed.to_pyarrow_table().to_pylist())
    expected = sorted(
        [(i, f"w{w}") for w in range(writers) for i in range(w * 1000, w * 1000 + rows * batches)]
        + [(100000 + i, "master") for i in range(10 * master_batches)]
    )
    assert found == expected  # every row once: no commit lost, none applied twice
    assert landed.version() == writers * batches + master_batches
    for w in range(writers):
        assert landed.transaction_version(f"w{w}") == batches - 1


def test_processes_racing_on_one_app_transaction_land_it_once(
    spark: SparkSession,
    s3_server: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two processes commit the same step (app id and version) from the same table version
    (a barrier in the commit guard): the store's conditional put lets one commit, and the
    other finds the transaction committed and says it did not commit."""
    environment = s3_server.environment()
    table = f"s3://{s3_bucket}/step"
    options = ObjectStore.from_environment(environment).delta_options()
    write_deltalake(
        table, pa.Table.from_pylist([], schema=spark_to_arrow(SCHEMA)), storage_options=options
    )
    barrier = f"{tmp_path / 'barrier'}:2"
    procs = {
        label: start(
            [
                "-m", "tests.warehouse.append_worker", table, "step", 0, 30, 1,
                "--label", label, "--barrier", barrier,
            ],
            environment,
        )
        for label in ("p0", "p1")
    }  # fmt: skip
    outcomes = {label: json.loads(finished(proc)[-1]) for label, proc in procs.items()}
    winners = [label for label, outcome in outcomes.items() if outcome["committed"]]
    assert len(winners) == 1, outcomes
    landed = DeltaTable(table, storage_options=options)
    assert landed.version() == 1
    rows = landed.to_pyarrow_table().to_pylist()
    assert sorted(r["id"] for r in rows) == list(range(30))
    assert {r["writer"] for r in rows} == set(winners)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert open_engine(spark, "embedded").transaction_version(table, "step") == 0


@pytest.mark.parametrize("engine_name", ["native", "embedded"])
def test_each_engine_writes_and_reads_a_table_on_the_store(
    spark: SparkSession, s3_env: S3Server, s3_bucket: str, engine_name: str
) -> None:
    """Both Delta engines reach the store from the environment (delta-spark through the
    session's S3A settings, delta-rs through its storage options): appends with an app
    transaction (a repeated one lands nothing), a delta-rs writer's commit in between and a
    partition replace, read back the same by each engine and by delta-rs on its own."""
    use_object_store(spark, ObjectStore.from_environment())
    engine = open_engine(spark, engine_name)
    table = f"s3://{s3_bucket}/{engine_name}"
    first = spark.createDataFrame([(1, "a"), (2, "a")], SCHEMA)
    assert engine.append(table, first, AppTransaction("load", 0), partition_by=["writer"]).committed
    assert not engine.append(table, first, AppTransaction("load", 0)).committed  # a re-run
    options = ObjectStore.from_environment().delta_options()
    write_deltalake(
        table,
        pa.table({"id": pa.array([3], pa.int64()), "writer": ["b"]}),
        mode="append",
        storage_options=options,
    )
    engine.replace(
        table,
        spark.createDataFrame([(4, "a")], SCHEMA),
        [PartitionFilter("writer", "=", "a")],
    )
    expected = [(3, "b"), (4, "a")]
    assert sorted((r.id, r.writer) for r in engine.read(table).collect()) == expected
    landed = DeltaTable(table, storage_options=options)
    assert sorted((r["id"], r["writer"]) for r in landed.to_pyarrow_table().to_pylist()) == expected
    assert landed.version() == 3
    assert engine.transaction_version(table, "load") == 0
