"""Spark session builder with the settings every job of this product relies on.

- UTC session time zone: Delta stores timestamp partition values without a zone, and they
  must not shift with the driver's locale.
- Parquet timestamps as INT64 micros: the Delta protocol's encoding (Spark's default is INT96).
- The raw local file system and no ``_SUCCESS`` markers: Spark's checksum side files and
  markers would otherwise be left in table directories as untracked clutter.
- The project's packages, zipped and shipped to the executors when the master is not local
  (:mod:`warehouse.code_archive`).
- delta-spark's jars, when the project's jar folder has them (``make jars`` fetches them with
  Maven into ``var/jars``; ``ENRICH_DELTA_JARS`` names another folder): they go on
  ``spark.jars`` with Delta's SQL extension and catalog, so ``engine: native`` can run.
  Nothing is downloaded at run time.
- For a pipeline whose tables or landing zones are in an object store, Hadoop's S3A and its
  AWS SDK (``make object-store-deps`` fetches them into ``var/jars-s3``;
  ``ENRICH_OBJECT_STORE_JARS`` names another folder) go on ``spark.jars`` with the store's
  endpoint and credentials from the environment (:mod:`warehouse.object_store`). They stay
  off the driver's class path, so the class archive stays valid for every session.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pyspark.sql import DataFrame, SparkSession

from common.errors import ConfigError, SparkServerError
from warehouse.code_archive import ship_project_code
from warehouse.jvm_archive import DRIVER_CLASS_PATH, archive_path, with_class_archive
from warehouse.object_store import S3A_FILESYSTEM, ObjectStore

logger = logging.getLogger(__name__)

REQUIRED_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.file.impl.disable.cache": "true",
    "spark.hadoop.parquet.summary.metadata.level": "NONE",
}

EMBEDDED_DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}

HEARTBEAT_INTERVAL = "spark.executor.heartbeatInterval"
NETWORK_TIMEOUT = "spark.network.timeout"
PYTHON_DAEMON = "spark.python.daemon.module"
LOCAL_PYTHON_DAEMON = "warehouse.python_daemon"
"""A local Spark's Python workers come from this daemon: pyspark's, without pyspark's zips
on the path (:mod:`warehouse.python_daemon`: each task re-read pyspark.zip's directory)."""
LOCAL_HEARTBEAT = "60s"
"""On a local master the executor is the driver's own JVM: its heartbeat carries only
metrics (the JVM's memory and GC figures, gathered each time), and at Spark's 10 s it was
a third of an idle session's CPU (an idle ``enrich stream``: 13.4 -> 10.1 CPU s over
120 s). Kept below ``spark.network.timeout`` (120 s by default), and left alone where the
caller set either."""


DELTA_JARS_ENV = "ENRICH_DELTA_JARS"
OBJECT_STORE_JARS_ENV = "ENRICH_OBJECT_STORE_JARS"
# Where the driver builds the zip of the project's packages it ships to a cluster.
CODE_DIR_ENV = "ENRICH_CODE_DIR"
DEFAULT_DELTA_JARS_DIR = Path(__file__).resolve().parent.parent / "var" / "jars"
DEFAULT_OBJECT_STORE_JARS_DIR = Path(__file__).resolve().parent.parent / "var" / "jars-s3"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
DELTA_SESSION_CONF: Mapping[str, str] = {
    "spark.sql.extensions": DELTA_EXTENSION,
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}


def code_archive_dir() -> Path:
    """``$ENRICH_CODE_DIR``, else ``<temp>/enrich-code``: the driver's own disk, since Spark
    serves the zip to the executors from there."""
    configured = os.environ.get(CODE_DIR_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "enrich-code"


def delta_jars_dir() -> Path | None:
    """The folder ``make jars`` fills: ``$ENRICH_DELTA_JARS``, else ``<repo>/var/jars``.

    ``ENRICH_DELTA_JARS=""`` means none: sessions then start without delta-spark.
    """
    configured = os.environ.get(DELTA_JARS_ENV)
    if configured is None:
        return DEFAULT_DELTA_JARS_DIR
    return Path(configured) if configured else None


def delta_jars(directory: Path | None = None) -> list[str]:
    """The delta-spark jars in ``directory`` (default :func:`delta_jars_dir`), sorted."""
    folder = directory if directory is not None else delta_jars_dir()
    if folder is None or not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.glob("*.jar") if p.is_file())


def object_store_jars() -> list[str]:
    """Hadoop S3A's jars: ``$ENRICH_OBJECT_STORE_JARS``, else ``<repo>/var/jars-s3``; a
    folder without them is an error naming the set-up command."""
    folder = Path(os.environ.get(OBJECT_STORE_JARS_ENV) or DEFAULT_OBJECT_STORE_JARS_DIR)
    jars = sorted(str(p) for p in folder.glob("*.jar") if p.is_file()) if folder.is_dir() else []
    if not any(Path(j).name.startswith("hadoop-aws-") for j in jars):
        raise ConfigError(
            f"an object-store location needs Hadoop's S3A jars in {folder} (found "
            f"{[Path(j).name for j in jars] or 'none'}); run `make object-store-deps`, or set "
            f"{OBJECT_STORE_JARS_ENV} to a folder holding hadoop-aws and the AWS SDK bundle"
        )
    return jars


def with_object_store(conf: Mapping[str, str], store: ObjectStore) -> dict[str, str]:
    """``conf`` plus S3A's jars on ``spark.jars`` and the store's S3A settings (the
    caller's own ``spark.hadoop.fs.s3a.*`` settings win)."""
    merged = {**store.spark_conf(), **conf}
    existing = [j for j in merged.get("spark.jars", "").split(",") if j]
    jars = object_store_jars()
    merged["spark.jars"] = ",".join([*existing, *[j for j in jars if j not in existing]])
    return merged


def with_delta_jars(
    conf: Mapping[str, str], jars: list[str], master: str = "local[2]"
) -> dict[str, str]:
    """``conf`` plus the jars on ``spark.jars`` and Delta's extension and catalog.

    Jars and extensions the caller already configured are kept (comma lists are extended);
    a catalog the caller chose for ``spark_catalog`` is left alone. On a local master,
    delta-spark rebuilds a table's state with one task per core instead of its default 50
    (``spark.databricks.delta.snapshotPartitions``, unless the caller set it): with 50,
    every snapshot of a small table takes seconds.
    """
    merged = dict(conf)
    if not jars:
        return merged
    existing = [j for j in merged.get("spark.jars", "").split(",") if j]
    merged["spark.jars"] = ",".join([*existing, *[j for j in jars if j not in existing]])
    extensions = [e for e in merged.get("spark.sql.extensions", "").split(",") if e]
    if DELTA_EXTENSION not in extensions:
        extensions.append(DELTA_EXTENSION)
    merged["spark.sql.extensions"] = ",".join(extensions)
    merged.setdefault(
        "spark.sql.catalog.spark_catalog", DELTA_SESSION_CONF["spark.sql.catalog.spark_catalog"]
    )
    cores = _local_cores(master)
    if cores is not None:
        merged.setdefault(DELTA_SNAPSHOT_PARTITIONS, str(cores))
    return merged


def on_driver_class_path(conf: Mapping[str, str], jars: list[str]) -> dict[str, str]:
    """``conf`` with ``jars`` first on the driver's class path (``spark.driver.extraClassPath``;
    the launcher puts it ahead of Spark's jars).

    Every driver gets delta-spark's jars there, whether or not its session uses Delta: the
    driver's class archive (:mod:`warehouse.jvm_archive`) is only mapped by a JVM whose
    class path is the one it was built with, so one class path for all sessions keeps one
    archive valid for all, and it holds delta-spark's classes too (a native driver's first
    table and commit were 10-15 s of class loading without them). A jar on the class path
    costs nothing until a class of it is used; ``spark.jars`` ships them to executors.
    Resolved paths: a checkout whose ``var/jars`` is a link names the same files.
    """
    merged = dict(conf)
    if not jars:
        return merged
    on_path = [p for p in merged.get(DRIVER_CLASS_PATH, "").split(os.pathsep) if p]
    resolved = [str(Path(j).resolve()) for j in jars]
    merged[DRIVER_CLASS_PATH] = os.pathsep.join(
        [*[j for j in resolved if j not in on_path], *on_path]
    )
    return merged


def _local_cores(master: str) -> int | None:
    """The cores of a ``local``/``local[N]``/``local[*]`` master; None for a cluster."""
    found = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if found is None:
        return None
    cores = found.group(1)
    if cores is None:
        return 1
    if cores == "*":
        return os.cpu_count() or 1
    return max(1, int(cores))


@dataclass(frozen=True)
class SparkSettings:
    """Where Spark runs and which extra settings it gets.

    ``master`` defaults to an embedded ``local[2]``; point it at ``spark://host:7077`` (or set
    ``SPARK_MASTER``) to scale out without changing any job code. ``remote``
    (``sc://host:port``, or ``SPARK_REMOTE``) connects to a running Spark Connect server
    instead, and then ``master`` and the static settings are the server's.
    """

    app_name: str = "enrichment"
    master: str = field(default_factory=lambda: os.environ.get("SPARK_MASTER", "local[2]"))
    conf: Mapping[str, str] = field(default_factory=dict)
    remote: str | None = field(default_factory=lambda: effective_remote(None))
    delta_jars: bool = True
    # The object store the session reads and writes, if any (its jars and S3A settings).
    object_store: ObjectStore | None = None


DEFAULT_MASTER = "local[2]"


def effective_master(command_line: str | None, configured: str | None) -> str:
    """The Spark master a command runs on, first set wins: the command line (``--master``),
    ``SPARK_MASTER``, the config's ``spark.master``, then ``local[2]``. The environment
    beats the config so that one config runs locally and, on a cluster's workers, against
    the cluster's master."""
    return command_line or os.environ.get("SPARK_MASTER") or configured or DEFAULT_MASTER


def effective_remote(configured: str | None) -> str | None:
    """The Spark Connect URL a command uses: the config's ``spark.remote``, else
    ``SPARK_REMOTE``, else None (in-process Spark)."""
    return configured or os.environ.get("SPARK_REMOTE") or None


def session_conf(
    conf: Mapping[str, str],
    master: str,
    with_delta: bool = True,
    object_store: ObjectStore | None = None,
) -> dict[str, str]:
    """Every setting a Spark this product runs gets, in-process or as a Connect server:
    the embedded defaults, ``conf`` over them, delta-spark's jars and extension (unless
    ``with_delta`` is false; the jars are on the driver's class path either way), S3A's
    jars and settings for ``object_store``, the driver's class archive
    (:mod:`warehouse.jvm_archive`), then ``REQUIRED_CONF``."""
    merged = {**EMBEDDED_DEFAULTS, **conf}
    if _local_cores(master) is not None:
        merged = with_idle_heartbeat(merged)
        if PYTHON_DAEMON not in merged and _workers_import(LOCAL_PYTHON_DAEMON):
            merged[PYTHON_DAEMON] = LOCAL_PYTHON_DAEMON
    if object_store is not None:
        merged = with_object_store(merged, object_store)
    jars = delta_jars()
    if with_delta:
        merged = with_delta_jars(merged, jars, master)
    merged = on_driver_class_path(merged, jars)
    return {**with_class_archive(merged, archive_path()), **REQUIRED_CONF}


def with_idle_heartbeat(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with a heartbeat every :data:`LOCAL_HEARTBEAT`, unless it sets the heartbeat
    or ``spark.network.timeout`` (Spark refuses a heartbeat not below the timeout)."""
    merged = dict(conf)
    if NETWORK_TIMEOUT not in merged:
        merged.setdefault(HEARTBEAT_INTERVAL, LOCAL_HEARTBEAT)
    return merged


def _workers_import(module: str) -> bool:
    """Whether the Python a local Spark starts its workers with (``PYSPARK_PYTHON``, else
    this interpreter), in this working directory and environment, imports ``module``: a
    daemon module it could not import would fail every Python task."""
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    return _imports(python, os.getcwd(), os.environ.get("PYTHONPATH", ""), module)


@functools.cache
def _imports(python: str, cwd: str, python_path: str, module: str) -> bool:
    """One probe per interpreter, folder and PYTHONPATH (the arguments are the cache's key;
    the probe inherits the process's environment and folder)."""
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        done = subprocess.run([python, "-c", probe], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        logger.info("Python workers keep pyspark's own daemon: %s", e)
        return False
    return done.returncode == 0


def is_connect(session: Any) -> bool:
    """True for a Spark Connect client session (it has no JVM on this side)."""
    return type(session).__module__.startswith("pyspark.sql.connect")


def build_session(settings: SparkSettings | None = None) -> SparkSession:
    """Return the active session, or build one with the product's required settings."""
    settings = settings or SparkSettings()
    if settings.remote:
        return _connect_session(settings, settings.remote)
    # pyspark decides by the environment too: refuse clearly instead of its own errors.
    if os.environ.get("SPARK_REMOTE"):
        raise ConfigError(
            f"SPARK_REMOTE is {os.environ['SPARK_REMOTE']!r} but this session was asked to run "
            "in-process; unset SPARK_REMOTE, or let the session connect to it"
        )
    if "SPARK_CONNECT_MODE_ENABLED" in os.environ:
        raise ConfigError(
            "this process already uses a Spark Connect session; pyspark allows one kind per "
            "process, so run in-process Spark in a process of its own"
        )
    # Python workers must run this interpreter (its packages: pyarrow, numpy), not whatever
    # "python3" is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(settings.app_name).master(settings.master)
    jars = delta_jars() if settings.delta_jars else []
    conf = session_conf(settings.conf, settings.master, settings.delta_jars, settings.object_store)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if settings.object_store is not None:
        # getOrCreate may have returned a session started before (a warm worker's, a test
        # run's): its Hadoop settings are set again, at run time, from the environment's.
        use_object_store(session, settings.object_store)
    # On a cluster the executors import the project's kernels from the zip this ships.
    ship_project_code(session.sparkContext, code_archive_dir())
    for key, value in REQUIRED_CONF.items():
        if not key.startswith("spark.hadoop."):
            session.conf.set(key, value)
    archive = archive_path()
    logger.info(
        "spark session %s on %s with %d delta-spark jar(s) from %s, JVM class archive %s",
        session.version,
        settings.master,
        len(jars),
        delta_jars_dir(),
        archive if archive is not None and archive.is_file() else "none",
    )
    return session


def use_object_store(session: SparkSession, store: ObjectStore) -> None:
    """Point an in-process session's Hadoop S3A settings at ``store``; the session must
    have been started with S3A's jars (``spark.jars``, see :func:`with_object_store`)."""
    jvm = session._jvm
    if jvm is None:
        return
    if not bool(jvm.org.apache.spark.util.Utils.classIsLoadable(S3A_FILESYSTEM)):
        raise ConfigError(
            f"this Spark session was started without Hadoop's S3A ({S3A_FILESYSTEM}), so it "
            "cannot reach the object store; start it with the object-store jars "
            "(`make object-store-deps`, SparkSettings.object_store)"
        )
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in store.spark_conf().items():
        hadoop.set(key.removeprefix("spark.hadoop."), value)


def _connect_session(settings: SparkSettings, remote: str) -> SparkSession:
    """A Spark Connect session to ``remote`` with the product's session settings.

    Runtime SQL settings are set per session; static ones (``spark.hadoop.*``, memory, jars)
    are the server's, so a server started without the required ones is reported once.
    """
    from pyspark.errors import PySparkException

    from warehouse.connect_address import parse_remote, port_answers

    try:
        address = parse_remote(remote)
    except ValueError as e:
        raise ConfigError(f"spark.remote / SPARK_REMOTE: {e}") from e
    # The client retries an unreachable server for minutes; a closed port is known at once.
    if not port_answers(address, timeout=2.0):
        raise SparkServerError(
            f"no Spark Connect server answers at {address.url}; start one with "
            "`enrich spark-server` (or `make spark-server`), or remove spark.remote / "
            "SPARK_REMOTE to run Spark in-process"
        )
    from pyspark import SparkContext

    if SparkContext._active_spark_context is not None:
        raise ConfigError(
            f"spark.remote is {address.url}, but this process already runs an in-process Spark "
            "session; pyspark allows one kind per process, so run the command in a process "
            "of its own"
        )
    try:
        # The URL as given: its ;token=...;use_ssl=... parameters are the client's business.
        session = SparkSession.builder.remote(remote).appName(settings.app_name).getOrCreate()
        left_to_server: list[str] = []
        missing: list[str] = []  # the required static ones: checksum and marker files
        for key, value in {**settings.conf, **REQUIRED_CONF}.items():
            if session.conf.isModifiable(key):
                session.conf.set(key, value)
            elif session.conf.get(key, None) != value:
                required_static = key in REQUIRED_CONF and key.startswith("spark.hadoop.")
                (missing if required_static else left_to_server).append(key)
    except PySparkException as e:
        raise SparkServerError(
            f"cannot use the Spark Connect server at {address.url}: {e}; start one with "
            "`enrich spark-server` (or `make spark-server`)"
        ) from e
    if left_to_server:
        logger.warning(
            "spark.conf keys %s are static: the Spark Connect server at %s keeps its own "
            "values (start it with them: `enrich spark-server` takes the config's spark.conf)",
            sorted(left_to_server),
            address.url,
        )
    if missing:
        logger.warning(
            "the Spark Connect server at %s was started without %s: Spark may leave "
            "checksum and _SUCCESS files in table folders (`enrich spark-server` sets them)",
            address.url,
            ", ".join(f"{k}={REQUIRED_CONF[k]}" for k in missing),
        )
    logger.info("spark connect session %s at %s", session.version, address.url)
    return cast(SparkSession, session)


def has_delta_jars(session: SparkSession) -> bool:
    """True when the delta-spark JVM classes are on the driver's classpath.

    Jars on ``spark.jars`` live in Spark's own class loader, not in the JVM's system one, so
    the lookup goes through Spark's (``Class.forName`` alone would miss them).
    """
    if is_connect(session):
        return False  # no JVM on this side; over Connect the embedded engine writes Delta
    jvm = session._jvm
    if jvm is None:
        return False
    try:
        return bool(jvm.org.apache.spark.util.Utils.classIsLoadable("io.delta.tables.DeltaTable"))
    except Exception:  # noqa: BLE001 - py4j raises a generic Py4JJavaError
        return False


DEFAULT_BROADCAST_BYTES = 10 * 1024 * 1024  # Spark's own default autoBroadcastJoinThreshold


def parallelism(session: SparkSession) -> int:
    """How many tasks run at once: the default parallelism in-process; over Spark Connect,
    ``spark.default.parallelism`` if the server sets it, else the shuffle partitions."""
    if not is_connect(session):
        return max(1, session.sparkContext.defaultParallelism)
    configured = session.conf.get("spark.default.parallelism", None)
    if configured:
        return max(1, int(configured))
    return max(1, int(session.conf.get("spark.sql.shuffle.partitions", "200") or 200))


def broadcast_threshold(session: SparkSession) -> float:
    """Spark's broadcast threshold in bytes (``-1`` disables broadcasting: 0 here)."""
    raw = session.conf.get("spark.sql.autoBroadcastJoinThreshold", None)
    if raw is None:
        return float(DEFAULT_BROADCAST_BYTES)
    text = str(raw).strip().lower()
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    found = re.fullmatch(r"(-?\d+)\s*([kmgt]?)b?", text)
    if found is None:
        raise ConfigError(
            f"spark.sql.autoBroadcastJoinThreshold is {raw!r}; expected bytes such as 10485760 "
            "or 10m"
        )
    value = int(found.group(1)) * units[found.group(2) or "b"]
    return float(max(0, value))


@dataclass(frozen=True)
class PlanSize:
    """Catalyst's estimate of a DataFrame's size, read from its optimized plan: no job runs.

    ``bytes`` is what Spark's own broadcast rule compares with its threshold (file sizes for
    a file scan, measured bytes for a materialized cache). ``rows`` is known only where
    Catalyst knows it exactly (a materialized cache, analysed tables), else None.
    """

    bytes: float
    rows: int | None


# The root node's statistics in ``explain("cost")``: "Statistics(sizeInBytes=235.9 KiB,
# rowCount=2.00E+4)"; Spark prints sizes with binary units and one decimal.
_COST_STATISTICS = re.compile(
    r"Statistics\(sizeInBytes=([0-9.Ee+-]+)\s*(B|KiB|MiB|GiB|TiB|PiB|EiB)"
    r"(?:,\s*rowCount=([0-9.Ee+-]+))?"
)
_BINARY_UNITS = {"B": 0, "KiB": 1, "MiB": 2, "GiB": 3, "TiB": 4, "PiB": 5, "EiB": 6}


def plan_size(frame: DataFrame) -> PlanSize:
    """The optimizer's size estimate of ``frame``, in-process or over Spark Connect."""
    if is_connect(frame.sparkSession):
        return parse_cost_statistics(frame._explain_string(mode="cost"))  # type: ignore[operator]
    stats = frame._jdf.queryExecution().optimizedPlan().stats()
    rows = stats.rowCount()
    return PlanSize(
        bytes=float(str(stats.sizeInBytes())),
        rows=int(str(rows.get())) if rows.isDefined() else None,
    )


def parse_cost_statistics(explained: str) -> PlanSize:
    """The root's statistics from ``explain(mode="cost")`` text (its first ``Statistics``,
    under "Optimized Logical Plan"); the printed size is rounded to one decimal."""
    optimized = explained.split("== Optimized Logical Plan ==", 1)[-1]
    found = _COST_STATISTICS.search(optimized)
    if found is None:
        raise SparkServerError(
            "expected 'Statistics(sizeInBytes=...)' in the optimized plan's cost explain, "
            f"found none in: {optimized[:300]!r}"
        )
    size = float(found.group(1)) * 1024 ** _BINARY_UNITS[found.group(2)]
    rows = int(float(found.group(3))) if found.group(3) else None
    return PlanSize(bytes=size, rows=rows)
