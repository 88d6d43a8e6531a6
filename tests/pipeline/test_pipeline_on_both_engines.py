"""The demo pipeline on each Delta engine, over Spark Connect and on a Spark standalone
cluster: every table it writes equal.

The demo config (configs/demo.yaml) trimmed to its orders stream: the SSBJ stage
orders_customer feeding the A-DSP stage orders_promotions, both with their quality gates.
It runs through ``jobs.enrich.main`` once with ``warehouse.engine: embedded`` and once with
``native``, on the same TPC-H data (the embedded run generates it and its masters, the
native run starts from a copy): ingest + one step of every stage (``run``) and
write-audit-publish (``validate``) of one hourly interval; the native run then backfills
that interval (replacing its silver partitions, auditing and publishing them), and its
tables after the backfill must equal the embedded run's live ones: a backfill of an
interval whose data and masters did not change gives the rows the live run gave (the
embedded engine's backfills are tests/pipeline/test_backfill.py's). Every
table the pipeline owns (masters, bronze, silver, gold, quarantine) is read back with
delta-rs on its own, an engine-independent reader, and compared as a multiset across the
engines.

A third run uses the embedded engine through a Spark Connect server started on loopback by
``enrich spark-server``: every command runs in its own process and connects to that warm
server, as the DAG's tasks do with ``spark.remote``. Its tables must equal the in-process
runs' tables too. It starts from a copy of the embedded run's generated data and masters
and runs the live interval (the backfill's code paths are the native run's).

A fourth run uses the embedded engine on a Spark standalone cluster on loopback (a master and
two one-core workers started from the pyspark package's ``spark-class``) whose hosts share no
disk with the driver: the workers run in a mount namespace where the test's folders and the
checkout's ``var/`` are empty, and the warehouse and the landing zone are in an object store
(a SeaweedFS server on loopback). Every command is a child process given ``--master
spark://...``, as an Airflow worker would run it; the project's code reaches the executors
only as the zip the driver ships (:mod:`warehouse.code_archive`: the project's package
folders are among those hidden, so nothing else could give them), S3A's jars through
``spark.jars``. It starts from the same copy (its masters uploaded to the bucket) and runs
the live interval's ``run`` (ingest and the stages, whose Python code the executors import
from the zip); the tables it writes must equal the in-process runs'.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from demo.data import deliver
from demo.prepare import demo_folder
from jobs.enrich import main as enrich
from pipeline.config import load_config
from pipeline.layout import WarehouseLayout
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset
from tests.object_store_server import S3Server
from tests.spark_cluster import spark_cluster
from warehouse.code_archive import shipped_packages
from warehouse.connect_address import RemoteAddress, parse_remote, port_answers
from warehouse.connect_server import free_port
from warehouse.object_store import ObjectLocation, ObjectStore, storage_options

pytestmark = pytest.mark.slow

CONFIG = REPO_ROOT / "configs" / "demo.yaml"
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
INTERVALS = 1
SCALE = "0.002"
VALIDATED = ("gold ", "quarantined ")  # the tables `validate` writes
SEEDED = Path("var/demo")  # what `demo-data` writes under the run's folder: data, masters
LINEITEM = "lineitem_suppliers"  # the demo's third stage, left out to keep this test short
# Columns whose values are the wall-clock time of the run that wrote the row.
WALL_CLOCK_COLUMNS = frozenset({"_quarantined_at"})


def normalise(value: Any, landing: str) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    if isinstance(value, str):
        return value.replace(landing, "<landing>")  # landing file names
    return value


def table_rows(path: str, landing: str) -> tuple[list[str], list[tuple]]:
    table = DeltaTable(path, storage_options=storage_options(path)).to_pyarrow_table()
    columns = sorted(c for c in table.column_names if c not in WALL_CLOCK_COLUMNS)
    return columns, [tuple(normalise(r[c], landing) for c in columns) for r in table.to_pylist()]


def upload_folder(folder: Path, location: str) -> None:
    """Every file under ``folder`` to the same relative keys under ``location``: a Delta
    table's files name each other relatively, so the copy is the same table."""
    target = ObjectLocation.parse(location)
    client = ObjectStore.from_environment().client()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        key = f"{target.key.rstrip('/')}/{path.relative_to(folder).as_posix()}"
        client.put_object(Bucket=target.bucket, Key=key, Body=path.read_bytes())


def run_pipeline(
    engine: str,
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    remote: str | None = None,
    master: str | None = None,
    seed: Path | None = None,
    keep_seed: Path | None = None,
    validate: bool = True,
    bucket: str | None = None,
    backfill: bool = False,
) -> dict[str, Any]:
    """Run the demo on ``engine`` under ``folder``; the rows of every table it owns.

    With ``remote`` each command is a child process connected to that Spark Connect server;
    with ``master`` a child process running Spark against that cluster. ``keep_seed``
    receives a copy of what ``demo-data`` wrote (data and masters); a run given it as
    ``seed`` starts from that copy instead of generating the data again. With ``backfill``
    (an in-process run) the interval is backfilled after the live run, and the rows of
    every table are taken again. What the child runs prove is that the stages and the
    write-audit-publish of the same data give the same tables over Connect and on a cluster.
    With ``bucket`` the warehouse and the landing zone are in that bucket of the object
    store the environment names (the seed's masters uploaded there).
    """
    if seed is not None:
        shutil.copytree(seed, folder / SEEDED, ignore=shutil.ignore_patterns("warehouse"))
        if bucket is None:
            shutil.copytree(seed / "warehouse", folder / SEEDED / "warehouse")
        else:
            upload_folder(seed / "warehouse", f"s3://{bucket}/warehouse")
    folder.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(folder)  # the demo config's relative paths now land in folder
    raw = yaml.safe_load(CONFIG.read_text())
    raw["warehouse"]["engine"] = engine
    if remote is not None:
        raw["spark"]["remote"] = remote
        engine = f"{engine} over Connect"
    child = remote is not None or master is not None
    global_args = ["--master", master] if master is not None else []
    if master is not None:
        engine = f"{engine} on {master}"
    raw["expectations_dir"] = str(REPO_ROOT / "expectations")
    if bucket is not None:
        raw["warehouse"]["root"] = f"s3://{bucket}/warehouse"
        raw["warehouse"]["local_root"] = str(SEEDED)
        raw["streams"]["orders"]["landing"] = f"s3://{bucket}/landing/orders"
    del raw["streams"]["lineitem"], raw["masters"]["partsupp"], raw["quality"][LINEITEM]
    raw["stages"] = [s for s in raw["stages"] if s["output"] != LINEITEM]
    config_path = folder / "demo.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    base = ["--config", str(config_path)]

    def step(*args: str) -> None:
        started = time.monotonic()
        if not child:
            assert enrich([*base, *args]) == 0, f"{engine}: enrich {' '.join(args)} failed"
        else:
            done = subprocess.run(
                [sys.executable, "-m", "jobs.enrich", *base, *global_args, *args],
                cwd=folder,
                check=False,
                capture_output=True,
                text=True,
            )
            assert done.returncode == 0, f"{engine}: enrich {args}: {done.stderr[-3000:]}"
            # Proof the command ran on the server or the cluster, not on a Spark of its own.
            proof = (
                rf"spark connect session \S+ at {re.escape(remote)}"
                if remote is not None
                else rf"shipping enrich-code-\w+\.zip to the executors of {re.escape(str(master))}"
            )
            assert re.search(proof, done.stderr), done.stderr[-2000:]
        print(f"{engine}: enrich {args[0]} {time.monotonic() - started:.1f}s")

    if seed is None:
        demo = ["demo-data", "--scale", SCALE, "--intervals", str(INTERVALS)]
        step(*demo, "--start", START.isoformat())
        if keep_seed is not None:
            shutil.copytree(folder / SEEDED, keep_seed)
    config = load_config(config_path)
    assert demo_folder(config) == folder / SEEDED
    layout = WarehouseLayout.of(config)
    outbox = demo_folder(config) / "outbox"
    landing = config.streams["orders"].landing
    manifest = json.loads((outbox / "manifest.json").read_text())
    for index in range(len(manifest["intervals"])):
        for stream in manifest["streams"]:
            deliver(outbox, stream, index, config.streams[stream].landing)
        step("run", "--run-id", f"i{index}")
        if validate:
            step("validate", "--run-id", f"i{index}")
    paths = {f"master {name}": layout.master(config, name) for name in config.masters}
    for stream in config.streams:
        paths[f"bronze {stream}"] = layout.bronze(stream)
        paths[f"ingest quarantine {stream}"] = layout.quarantine(stream)
    for stage in config.stages:
        paths[f"silver {stage.output}"] = layout.staged(stage.output)
        paths[f"gold {stage.output}"] = layout.published(stage.output)
        paths[f"quarantined {stage.output}"] = layout.quarantined_output(stage.output)

    def tables() -> dict[str, Any]:
        return {
            name: table_rows(path, landing)
            for name, path in paths.items()
            if DeltaTable.is_deltatable(path, storage_options=storage_options(path))
        }

    found = {"live": tables()}
    if backfill:
        assert not child
        # The backfill replaces the interval's silver partitions, then audits and publishes.
        end = START + dt.timedelta(seconds=manifest["interval_seconds"])
        step("backfill", "--run-id", "bf", "--start", START.isoformat(), "--end", end.isoformat())
        found["backfilled"] = tables()
    return found


@pytest.fixture
def spark_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``enrich spark-server`` on a free loopback port, as an operator would run it."""
    address = RemoteAddress("127.0.0.1", free_port())
    port = address.port
    config = tmp_path / "server.yaml"
    raw = yaml.safe_load(CONFIG.read_text())
    raw["spark"]["conf"] = {**raw["spark"]["conf"], "spark.driver.memory": "1g"}
    config.write_text(yaml.safe_dump(raw))
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "jobs.enrich", "--config", str(config), "spark-server"),
            *("--port", str(port), "--log", str(tmp_path / "server.log")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 180
    while not port_answers(address):
        assert server.poll() is None, f"enrich spark-server exited: {server.communicate()[0]}"
        assert time.monotonic() < deadline, "enrich spark-server did not listen within 180s"
        time.sleep(0.5)
    try:
        yield server, f"sc://127.0.0.1:{port}"
    finally:
        if server.poll() is None:  # the test failed before stopping it: stop it the same way
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def test_demo_pipeline_writes_the_same_tables_on_both_engines_over_connect_and_on_a_cluster(
    spark: SparkSession,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    spark_server: tuple[subprocess.Popen[str], str],
    s3_server: S3Server,
    s3_bucket: str,
) -> None:
    server, url = spark_server
    seed = tmp_path / "seed"
    results = {
        "embedded": run_pipeline("embedded", tmp_path / "embedded", monkeypatch, keep_seed=seed),
        "native": run_pipeline(
            "native", tmp_path / "native", monkeypatch, seed=seed, backfill=True
        ),
    }
    results["connect"] = run_pipeline("embedded", tmp_path / "connect", monkeypatch, url, seed=seed)
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    # The project's own packages are hidden too: the executors can import them only from
    # the zip the driver ships (the editable install's finder would find empty folders), so
    # a `run` that succeeds there proves the zip carried the stages' code.
    hidden = [
        tmp_path_factory.getbasetemp(),
        REPO_ROOT / "var",
        *(REPO_ROOT / package for package in shipped_packages()),
    ]
    with spark_cluster(tmp_path / "cluster-processes", hidden_from_workers=hidden) as cluster:
        assert all(path.is_dir() and any(path.iterdir()) for path in hidden)
        assert all(cluster.listings_on_workers(path) == [[], []] for path in hidden)
        # `run` only: the stages' Python code is what must reach the executors; validate's
        # GX jobs are plain aggregates, on a cluster as anywhere (about 95 s a command here).
        results["cluster"] = run_pipeline(
            "embedded",
            tmp_path / "cluster",
            monkeypatch,
            master=cluster.url,
            seed=seed,
            validate=False,
            bucket=s3_bucket,
        )
        finished = [a for a in cluster.status().get("completedapps", []) if isinstance(a, dict)]
        assert len(finished) == 1, cluster.status()  # `run` was an application of the cluster
    embedded = results["embedded"]

    for name in ("bronze orders", "gold orders_customer", "gold orders_enriched"):
        assert embedded["live"][name][1], f"{name} is empty: the comparison would prove nothing"
    comparisons = [("native", "live"), ("native", "backfilled"), ("connect", "live")]
    for other, when in [*comparisons, ("cluster", "live")]:
        expected, found = embedded["live"], results[other][when]
        if other == "cluster":  # no validate: nothing published or quarantined yet
            expected = {n: v for n, v in expected.items() if not n.startswith(VALIDATED)}
        assert sorted(found) == sorted(expected), (other, when)
        for name in sorted(expected):
            columns, rows = expected[name]
            assert found[name][0] == columns, f"{other}, {when}: {name}"
            try:
                assert_same_multiset(found[name][1], rows)
            except AssertionError as e:
                raise AssertionError(
                    f"{name} ({when}) differs between embedded and {other}: {e}"
                ) from e

    # The operator's way to stop the server: SIGTERM, a clean exit, the port closed.
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0, server.communicate()[0]
    assert not port_answers(parse_remote(url))
