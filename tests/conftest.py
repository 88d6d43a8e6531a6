"""Shared fixtures: one embedded Spark session and one PostgreSQL server for the test run.

State-store URLs: ``postgres_url`` is a fresh database on the session's real PostgreSQL
server (see tests/postgres.py); ``state_store_url`` is parametrized over both backends,
``sqlite`` and ``postgres``, so a test that takes it runs once on each.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.helpers import TEST_SPARK_CONF
from tests.object_store_server import S3Server, started_s3_server
from tests.postgres import PostgresServer
from warehouse.spark import (
    SparkSettings,
    build_session,
    delta_jars,
    delta_jars_dir,
    has_delta_jars,
    object_store_jars,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Every JVM the tests start (this process's Spark driver, each `enrich` child's, Connect
# servers, the cluster's daemons, Airflow tasks) inherits this. They live seconds to minutes
# on tiny data, so C2's compilations never pay back and take CPU from the two cores the work
# runs on: C1 only measured 408 s -> 272 s for tests/warehouse/test_crash_and_concurrency.py
# alone. It changes how fast code runs, never what it computes. C1 alone gets a 48 MB code
# cache (240 MB with C2): a pytest process's JVM runs every test file of its share, and
# one filled it ("CodeCache is full. Compiler has been disabled": compilation stopped and
# never restarted, the rest interpreted). The cache is made C2's size.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
if TEST_JVM_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = (
        f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {TEST_JVM_OPTIONS}".strip()
    )


@pytest.fixture(scope="module", autouse=True)
def workers_stopped_after_each_file(pipeline_workers: Path) -> Iterator[None]:
    """The warm workers a test file's DAG runs started are stopped when the file ends: an
    idle worker's JVM still spends CPU (heartbeats, the JIT, the collector), and the
    test processes share two cores; a later file that needs one starts its own."""
    yield
    from jobs.worker import stop_workers_in

    stop_workers_in(pipeline_workers)


@pytest.fixture(autouse=True)
def session_settings_restored() -> Iterator[None]:
    """The shared Spark session's runtime settings as they were before the test.

    A command run in-process (``jobs.enrich.main``) builds its session with
    ``getOrCreate``, which applies the config's settings to the session already running:
    the demo config's ``spark.sql.shuffle.partitions: "4"`` stayed after the test that ran
    it, and a later test of the same process whose SSBJ stage takes its buckets from that
    setting cached another key (``tests/pipeline/ssbj/test_stage.py``'s hot-key tests
    failed after ``test_pipeline_on_both_engines.py``). A test that starts no session
    costs nothing here.
    """
    active = SparkSession.getActiveSession()
    before = active.conf.getAll if active is not None else None
    yield
    session = SparkSession.getActiveSession()
    if session is None or before is None or session is not active:
        return
    after = session.conf.getAll
    for key in before.keys() | after.keys():
        if before.get(key) != after.get(key) and session.conf.isModifiable(key):
            if key in before:
                session.conf.set(key, before[key])
            else:
                session.conf.unset(key)


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An isolated Airflow home (SQLite metadata DB), set before anything imports Airflow:
    Airflow reads its configuration once, at its first import."""
    from orchestration.airflow_env import prepare_airflow_home

    home = tmp_path_factory.mktemp("airflow")
    prepare_airflow_home(home)
    yield home


@pytest.fixture(scope="session", autouse=True)
def pipeline_workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder of the warm pipeline workers this test process's DAG runs start (the
    generated DAG's default, ``jobs/worker.py``); every one is stopped at the end."""
    from jobs.worker import SOCKET_DIR_ENV, stop_workers_in

    # Short: a Unix socket's path is limited to about 100 bytes.
    folder = Path(tempfile.mkdtemp(prefix="enrich-w-"))
    previous = os.environ.get(SOCKET_DIR_ENV)
    os.environ[SOCKET_DIR_ENV] = str(folder)
    yield folder
    stop_workers_in(folder)
    shutil.rmtree(folder, ignore_errors=True)
    if previous is None:
        os.environ.pop(SOCKET_DIR_ENV, None)
    else:
        os.environ[SOCKET_DIR_ENV] = previous


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The run's Spark session, always with the delta-spark jars (``make jars``).

    Both Delta engines are tested in every run: the native one needs the jars (``engine:
    auto``, the configs' default, picks the embedded one; tests of the native engine ask
    for it). A session without the jars would quietly leave the native engine untested, so
    the fixture refuses to start.
    """
    # The tests' in-process session: an exported SPARK_REMOTE would make pyspark (and
    # build_session) refuse it; the Connect tests start their own server.
    os.environ.pop("SPARK_REMOTE", None)
    jars = delta_jars()
    if not jars:
        raise RuntimeError(
            f"no delta-spark jars in {delta_jars_dir()}: run `make jars` (part of `make "
            "setup`), which fetches the versions the Makefile pins with Maven"
        )
    session = build_session(
        SparkSettings(
            app_name="tests",
            master="local[2]",
            conf={
                **TEST_SPARK_CONF,
                "spark.sql.shuffle.partitions": "2",
                "spark.driver.memory": "2g",
                # Hadoop S3A, so that in-process tests reach the object store too (each
                # points the session at its server: warehouse.spark.use_object_store).
                "spark.jars": ",".join(object_store_jars()),
            },
            remote=None,
        )
    )
    if jars and not has_delta_jars(session):
        session.stop()
        raise RuntimeError(
            f"the Spark session did not load the delta-spark jars {jars} "
            "(io.delta.tables.DeltaTable is not on its classpath)"
        )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server on 127.0.0.1, started on first use, stopped at the end."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """``postgresql+psycopg://enrich_test:<password>@127.0.0.1:<port>/test_<uuid>``: a fresh,
    empty database for this test, dropped afterwards."""
    name = postgres_server.create_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def state_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A state-store URL of a fresh, empty store, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))


# The slowest test files, slowest first (from `make test`'s --durations report). Under
# `make test`, xdist hands out files by their number of tests (its loadscope reorder, see
# the Makefile), so this order decides a run without xdist and ties among files.
SLOW_FILES_FIRST = (
    "tests/pipeline/test_pipeline_on_both_engines.py",
    "tests/warehouse/test_crash_and_concurrency.py",
    "tests/orchestration/test_airflow_services.py",
    "tests/pipeline/ssbj/test_stage.py",
    "tests/soak/test_soak.py",
    "tests/dags/test_dag_runs.py",
    "tests/pipeline/test_backfill.py",
    "tests/pipeline/test_adsp_layout.py",
    "tests/pipeline/ssbj/test_crash.py",
    "tests/pipeline/test_audit.py",
    "tests/pipeline/test_late_master.py",
    "tests/pipeline/test_stream_service.py",
    "tests/pipeline/test_object_store_pipeline.py",
    "tests/warehouse/test_landing_object_store.py",
    "tests/warehouse/test_object_store_commits.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: index for index, path in enumerate(SLOW_FILES_FIRST)}

    def order(item: pytest.Item) -> int:
        path = item.path.relative_to(REPO_ROOT).as_posix()
        return rank.get(path, len(SLOW_FILES_FIRST))

    items.sort(key=order)  # stable: the order within a file and among the rest is kept


# A pipeline whose first batch was run, audited and published (the audit and Data Docs
# tests work on copies of it).
@pytest.fixture(scope="session")
def base(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.pipeline.audit_harness import (
        FIRST_BATCH,
        arrive_and_run,
        quality_harness,
        validate,
    )

    root = tmp_path_factory.mktemp("base")
    h = quality_harness(spark, root)
    arrive_and_run(h, FIRST_BATCH, "r1")
    assert validate(h, "r1") == 0
    h.store.dispose()
    return root


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's ``tmp_path``, as the working directory: a config's relative paths (the
    demo's ``var/demo/...``) land there."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A real S3 server (SeaweedFS) on 127.0.0.1, started on first use, stopped at the end."""
    server = started_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The session's S3 server, this test's process pointed at it (the ``AWS_*`` variables
    warehouse.object_store reads)."""
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket of this test's own on the session's S3 server."""
    return s3_server.create_bucket("test")
