"""What a scheduled interval costs, end to end, against the same work written plainly.

    python -m benchmarks.interval_cost [--shapes equi20k ...] [--intervals 4]
                                       [--modes tasks warm plain duckdb]
                                       [--out benchmarks/results/interval-cost.md]

Each shape is a pipeline config, a master and one stream file per interval. The same
files go through four modes, one after the other, each in a fresh warehouse:

- ``tasks``: the pipeline as the generated Airflow DAG runs it by default: every task of
  the DAG run (``ingest``, one ``stage`` per stage, ``validate``) in its own ``enrich``
  process, which sends its command to the pipeline's warm worker (``enrich --worker``,
  ``schedule.worker.enabled``, the default; the first task starts the worker). The cost of
  starting such a task process is measured apart (``process start``): the interpreter and
  the client's imports, or, with ``--set schedule.worker.enabled=false``, the interpreter,
  the imports and a Spark session;
- ``warm``: the pipeline in one warm process: ``enrich run`` then ``enrich validate`` per
  interval through ``jobs.enrich.main`` in one interpreter, so the Spark session and every
  import are paid once;
- ``plain``: a plain PySpark script in one warm session doing the same work: read the
  landed file with its schema, the same joins written the obvious way (a broadcast hash
  join; a binned join for a band), the same checks as one aggregate per output, and a
  Delta append per output (delta-spark);
- ``duckdb``: DuckDB doing the same joins and checks over the same files, writing Parquet,
  the single-machine floor.

Every mode's published rows must equal the others' as multisets (the join columns, the
stream tuple id and the master columns), or the benchmark fails. The first interval of
each mode is warm-up (the first touch of each table, the JIT); the table reports the
median of the others, the steady state of a scheduled pipeline, and the ratios against
``plain`` in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

REPO = Path(__file__).resolve().parent.parent
logger = logging.getLogger("interval_cost")

FIRST_INTERVAL = datetime(2024, 1, 1)
INTERVAL = timedelta(hours=1)
SPARK_CONF = {"spark.sql.shuffle.partitions": "4"}


# ---------------------------------------------------------------------------- shapes


@dataclass(frozen=True)
class EquiJoin:
    """An equi stage: ``stream_key = master_key``, inner or left."""

    name: str
    join: str
    stream_key: str
    master_key: str


@dataclass(frozen=True)
class BandJoin:
    """A band theta stage: ``|stream_column - master_column| <= eps``."""

    name: str
    join: str
    stream_column: str
    master_column: str
    eps: float


@dataclass(frozen=True)
class RangeJoin:
    """A range theta stage: ``lo <= stream_column < hi``."""

    name: str
    join: str
    stream_column: str
    lo: str
    hi: str


Join = EquiJoin | BandJoin | RangeJoin


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: a stream, a master and the stages joining them."""

    name: str
    description: str
    stream: str
    stream_id: str
    stream_rows: int
    master: str
    master_keys: tuple[str, ...]
    joins: tuple[Join, ...]
    make_master: Callable[[Path], pa.Table]
    make_stream: Callable[[pa.Table, int, np.random.Generator], pa.Table]
    stream_format: str = "json"
    checks: dict[str, tuple[float, float]] = field(default_factory=dict)


def _tpch(scale: float, cache: Path, table: str) -> pa.Table:
    from demo.data import _plain, generate_tpch

    return _plain(pq.read_table(generate_tpch(scale, cache) / f"{table}.parquet"))


def partsupp_master(scale: float) -> Callable[[Path], pa.Table]:
    def make(cache: Path) -> pa.Table:
        return _tpch(scale, cache, "partsupp").select(
            ["ps_partkey", "ps_suppkey", "ps_availqty", "ps_supplycost"]
        )

    return make


def lineitem_stream(master: pa.Table, index: int, rng: np.random.Generator, rows: int) -> pa.Table:
    """``rows`` lineitem-like tuples keyed uniformly over the master's part keys (about 1%
    of them match no part), with event times inside interval ``index``."""
    parts = np.unique(master.column("ps_partkey").to_numpy())
    keys = rng.choice(parts, size=rows)
    misses = rng.random(rows) < 0.01
    keys = np.where(misses, keys + int(parts.max()) + 1, keys)
    first_id = index * rows
    return _with_event_time(
        pa.table(
            {
                "l_id": pa.array(np.arange(first_id, first_id + rows), pa.int64()),
                "l_orderkey": pa.array(rng.integers(1, 6_000_000, size=rows), pa.int64()),
                "l_partkey": pa.array(keys, pa.int64()),
                "l_quantity": pa.array(rng.integers(1, 51, size=rows).astype(float)),
                "l_extendedprice": pa.array(np.round(rng.uniform(900, 105_000, rows), 2)),
            }
        ),
        index,
        rng,
    )


def _with_event_time(table: pa.Table, index: int, rng: np.random.Generator) -> pa.Table:
    start = FIRST_INTERVAL + index * INTERVAL
    offsets = np.sort(rng.uniform(0, INTERVAL.total_seconds(), size=table.num_rows))
    times = [start + timedelta(seconds=float(s)) for s in offsets]
    return table.append_column("event_time", pa.array(times, pa.timestamp("us")))


def orders_stream(index: int, rng: np.random.Generator, rows: int) -> pa.Table:
    first_id = index * rows
    return _with_event_time(
        pa.table(
            {
                "o_id": pa.array(np.arange(first_id, first_id + rows), pa.int64()),
                "o_totalprice": pa.array(np.round(rng.uniform(900, 500_000, rows), 2)),
            }
        ),
        index,
        rng,
    )


def price_bands(count: int) -> Callable[[Path], pa.Table]:
    """``count`` adjacent price bands over orders' prices (one band per price)."""

    def make(cache: Path) -> pa.Table:
        edges = np.linspace(0, 600_000, count + 1)
        return pa.table(
            {
                "band_id": pa.array(np.arange(count), pa.int64()),
                "band_lo": pa.array(edges[:-1]),
                "band_hi": pa.array(edges[1:]),
                "band_name": pa.array([f"BAND-{i:04d}" for i in range(count)]),
            }
        )

    return make


def reference_orders(rows: int) -> Callable[[Path], pa.Table]:
    """A master of ``rows`` earlier orders with their prices (the band join's master)."""

    def make(cache: Path) -> pa.Table:
        rng = np.random.default_rng(99)
        return pa.table(
            {
                "r_id": pa.array(np.arange(rows), pa.int64()),
                "r_totalprice": pa.array(np.round(rng.uniform(900, 500_000, rows), 2)),
            }
        )

    return make


def equi_shape(name: str, description: str, scale: float, rows: int) -> Shape:
    return Shape(
        name=name,
        description=description,
        stream="li",
        stream_id="l_id",
        stream_rows=rows,
        master="partsupp",
        master_keys=("ps_partkey", "ps_suppkey"),
        joins=(
            EquiJoin("li_inner", "inner", "l_partkey", "ps_partkey"),
            EquiJoin("li_left", "left", "l_partkey", "ps_partkey"),
        ),
        make_master=partsupp_master(scale),
        make_stream=lambda master, index, rng: lineitem_stream(master, index, rng, rows),
        checks={"l_quantity": (1, 50)},
    )


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        equi_shape(
            "equi20k",
            "20k tuples through an inner and a left equi stage, partsupp SF0.125 (100k rows)",
            0.125,
            20_000,
        ),
        equi_shape(
            "equi200k",
            "200k tuples through an inner and a left equi stage, partsupp SF1 (800k rows)",
            1.0,
            200_000,
        ),
        Shape(
            name="range100k",
            description="100k orders against 300 price bands (range, left)",
            stream="ord",
            stream_id="o_id",
            stream_rows=100_000,
            master="bands",
            master_keys=("band_id",),
            joins=(RangeJoin("ord_band", "left", "o_totalprice", "band_lo", "band_hi"),),
            make_master=price_bands(300),
            make_stream=lambda master, index, rng: orders_stream(index, rng, 100_000),
            checks={"o_totalprice": (0, 600_000)},
        ),
        Shape(
            name="band20k",
            description="20k orders against 100k orders within eps = 1 (band, inner)",
            stream="ord",
            stream_id="o_id",
            stream_rows=20_000,
            master="refs",
            master_keys=("r_id",),
            joins=(BandJoin("ord_near", "inner", "o_totalprice", "r_totalprice", 1.0),),
            make_master=reference_orders(100_000),
            make_stream=lambda master, index, rng: orders_stream(index, rng, 20_000),
            checks={"o_totalprice": (0, 600_000)},
        ),
    )
}


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Prepared:
    """A shape's generated inputs: the master (Parquet) and one stream file per interval."""

    shape: Shape
    folder: Path
    master_file: Path
    stream_files: tuple[Path, ...]
    master_columns: tuple[str, ...]
    stream_schema: pa.Schema


def prepare(shape: Shape, folder: Path, intervals: int, cache: Path) -> Prepared:
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "outbox").mkdir(parents=True)
    master = shape.make_master(cache)
    master_file = folder / f"{shape.master}.parquet"
    pq.write_table(master, master_file)
    rng = np.random.default_rng(7)
    files = []
    schema = None
    for index in range(intervals):
        table = shape.make_stream(master, index, rng)
        schema = table.schema
        files.append(_write_stream(table, folder / "outbox" / f"{shape.stream}-{index:04d}", shape))
    assert schema is not None
    return Prepared(shape, folder, master_file, tuple(files), tuple(master.column_names), schema)


def _write_stream(table: pa.Table, stem: Path, shape: Shape) -> Path:
    if shape.stream_format == "parquet":
        path = stem.with_suffix(".parquet")
        pq.write_table(table, path)
        return path
    path = stem.with_suffix(".json")
    with path.open("w") as handle:
        for row in table.to_pylist():
            row["event_time"] = row["event_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            handle.write(json.dumps(row) + "\n")
    return path


_SPARK_TYPES = {
    pa.int64(): "bigint",
    pa.float64(): "double",
    pa.string(): "string",
    pa.timestamp("us"): "timestamp",
}


def pipeline_config(prepared: Prepared, root: Path) -> dict[str, Any]:
    shape = prepared.shape
    stages: list[dict[str, Any]] = []
    for join in shape.joins:
        stage: dict[str, Any] = {
            "name": join.name,
            "input": shape.stream,
            "master": shape.master,
            "join": join.join,
            "output": join.name,
        }
        if isinstance(join, EquiJoin):
            stage |= {"kind": "equi", "join_on": {join.stream_key: join.master_key}}
        elif isinstance(join, BandJoin):
            stage |= {
                "kind": "theta",
                "predicate": {
                    "type": "band",
                    "stream_column": join.stream_column,
                    "master_column": join.master_column,
                    "eps": join.eps,
                },
            }
        else:
            stage |= {
                "kind": "theta",
                "predicate": {
                    "type": "range",
                    "stream_column": join.stream_column,
                    "lo": join.lo,
                    "hi": join.hi,
                },
            }
        stages.append(stage)
    columns = [
        {
            "name": f.name,
            "type": _SPARK_TYPES[f.type],
            "nullable": f.name not in (shape.stream_id, "event_time"),
        }
        for f in prepared.stream_schema
    ]
    return {
        "name": "bench",
        "warehouse": {"root": str(root / "warehouse")},
        "spark": {"master": "local[2]", "conf": SPARK_CONF},
        "schedule": {"interval": "1h", "start": FIRST_INTERVAL.isoformat(), "retries": 0},
        "streams": {
            shape.stream: {
                "landing": str(root / "landing"),
                "format": shape.stream_format,
                "event_time": "event_time",
                "id_column": shape.stream_id,
                "columns": columns,
            }
        },
        "masters": {
            shape.master: {
                "table": f"masters/{shape.master}",
                "keys": list(shape.master_keys),
                "columns": list(prepared.master_columns),
            }
        },
        "stages": stages,
        "quality": {join.name: {"value_ranges": dict(shape.checks)} for join in shape.joins},
    }


def write_master_delta(prepared: Prepared, path: Path) -> None:
    """The master as a Delta table with its change feed on, as the demo writes masters."""
    from deltalake import write_deltalake

    write_deltalake(
        str(path),
        pq.read_table(prepared.master_file),
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def deliver(source: Path, landing: Path) -> None:
    """Place one file atomically (temp name, then rename), as a producer must."""
    landing.mkdir(parents=True, exist_ok=True)
    staging = landing / f"_{source.name}.tmp"
    shutil.copyfile(source, staging)
    os.replace(staging, landing / source.name)


# ---------------------------------------------------------------------------- results


@dataclass
class ModeResult:
    mode: str
    interval_seconds: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    """Seconds per phase per interval (what each mode can tell apart)."""
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    """Published rows per output, sorted, for the multiset comparison."""
    process_start: float | None = None

    def steady(self) -> float:
        rest = self.interval_seconds[1:] or self.interval_seconds
        return statistics.median(rest)

    def add_phase(self, name: str, seconds: float) -> None:
        self.phases.setdefault(name, []).append(seconds)


def compare_columns(prepared: Prepared) -> list[str]:
    """The columns every mode publishes for each join: the stream's and the master's."""
    stream = [f.name for f in prepared.stream_schema]
    return [*stream, *prepared.master_columns]


@contextlib.contextmanager
def timed(result: ModeResult, phase: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        result.add_phase(phase, time.perf_counter() - started)


# ---------------------------------------------------------------------------- pipeline modes


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` settings (dotted keys, ``*`` for every list item, YAML values) on top
    of the shape's config, e.g. ``stages.*.operator.mode=baseline``."""
    for item in overrides:
        key, _, text = item.partition("=")
        value = yaml.safe_load(text)
        targets: list[Any] = [config]
        parts = key.split(".")
        for part in parts[:-1]:
            nxt: list[Any] = []
            for target in targets:
                if part == "*":
                    nxt.extend(target)
                elif isinstance(target, list):
                    nxt.append(target[int(part)])
                else:
                    nxt.append(target.setdefault(part, {}))
            targets = nxt
        for target in targets:
            target[parts[-1]] = value
    return config


OVERRIDES: list[str] = []


def _pipeline_folder(prepared: Prepared, mode: str) -> tuple[Path, Path]:
    root = prepared.folder / mode
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    config = apply_overrides(pipeline_config(prepared, root), OVERRIDES)
    config_path = root / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    write_master_delta(prepared, root / "warehouse" / "masters" / prepared.shape.master)
    return root, config_path


def _window(index: int) -> list[str]:
    start = (FIRST_INTERVAL + index * INTERVAL).replace(tzinfo=UTC)
    return ["--start", start.isoformat(), "--end", (start + INTERVAL).isoformat()]


def run_warm(prepared: Prepared) -> ModeResult:
    """Every command of every interval through ``jobs.enrich.main`` in this process."""
    from jobs.enrich import main

    root, config_path = _pipeline_folder(prepared, "warm")
    result = ModeResult("warm")
    base = ["--config", str(config_path)]

    def enrich(*argv: str) -> None:
        code = main([*base, *argv])
        if code != 0:
            raise RuntimeError(f"enrich {' '.join(argv)} exited {code}")

    for index, source in enumerate(prepared.stream_files):
        deliver(source, root / "landing")
        started = time.perf_counter()
        window = ["--run-id", f"i{index}", *_window(index)]
        with timed(result, "run"):
            enrich("run", *window)
        with timed(result, "validate"):
            enrich("validate", *window)
        result.interval_seconds.append(time.perf_counter() - started)
        logger.info("warm: interval %d in %.2fs", index, result.interval_seconds[-1])
    # Whatever an operator still holds is joined and published, so every mode has
    # published the same tuples (not timed: a scheduled pipeline drains on its own cycle).
    enrich("drain", "--run-id", "final")
    enrich("validate", "--run-id", "final")
    result.rows = published_rows(prepared, root / "warehouse" / "gold")
    return result


def run_tasks(prepared: Prepared) -> ModeResult:
    """Every task of every interval as its own ``enrich`` process, as Airflow runs them."""
    root, config_path = _pipeline_folder(prepared, "tasks")
    result = ModeResult("tasks")
    in_worker = bool(
        yaml.safe_load(config_path.read_text())
        .get("schedule", {})
        .get("worker", {})
        .get("enabled", True)
    )
    result.process_start = process_start_seconds(in_worker)
    stages = [join.name for join in prepared.shape.joins]
    via = ["--worker"] if in_worker else []

    def enrich(*argv: str) -> float:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "jobs.enrich", "--config", str(config_path), *via, *argv],
            cwd=REPO,
            check=False,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"enrich {' '.join(argv)} exited {done.returncode}: {done.stderr[-3000:]}"
            )
        return time.perf_counter() - started

    for index, source in enumerate(prepared.stream_files):
        deliver(source, root / "landing")
        window = ["--run-id", f"i{index}", *_window(index)]
        seconds = 0.0
        for task, argv in [
            ("ingest", ["ingest"]),
            *[(f"stage {s}", ["stage", s]) for s in stages],
            ("validate", ["validate"]),
        ]:
            took = enrich(*argv, *window)
            result.add_phase(task, took)
            seconds += took
        result.interval_seconds.append(seconds)
        logger.info("tasks: interval %d in %.2fs", index, seconds)
    enrich("drain", "--run-id", "final")
    enrich("validate", "--run-id", "final")
    if in_worker:
        from jobs.worker import stop_worker

        stop_worker(config_path)
    result.rows = published_rows(prepared, root / "warehouse" / "gold")
    return result


# What a task process of the warm worker's clients pays before it sends its command.
CLIENT_START = "import jobs.enrich, jobs.worker, rich_argparse"

PROCESS_START = """
import time
started = time.perf_counter()
from warehouse.spark import SparkSettings, build_session
spark = build_session(SparkSettings(master="local[2]", conf={conf!r}))
print(time.perf_counter() - started)
"""


def process_start_seconds(in_worker: bool) -> float:
    """Wall seconds of a process that starts Python and imports the worker's client (or,
    without the worker, imports the session code and starts Spark), then exits: what every
    task of ``tasks`` pays before its work."""
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            CLIENT_START if in_worker else PROCESS_START.format(conf=SPARK_CONF),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=600,
    )
    return time.perf_counter() - started


def published_rows(prepared: Prepared, gold: Path) -> dict[str, list[tuple[Any, ...]]]:
    from deltalake import DeltaTable

    rows = {}
    for join in prepared.shape.joins:
        columns = compare_columns(prepared)
        table = DeltaTable(str(gold / join.name)).to_pyarrow_table(columns=columns)
        rows[join.name] = _sorted_rows(table, columns)
    return rows


def _plain_value(value: Any) -> Any:
    """Timestamps as naive UTC, whichever time zone a reader attached."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def _sorted_rows(table: pa.Table, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    values = [[_plain_value(v) for v in table.column(c).to_pylist()] for c in columns]
    return sorted(
        zip(*values, strict=True), key=lambda row: tuple((v is None, v) for v in row)
    )  # nulls last


# ---------------------------------------------------------------------------- plain modes


def run_plain(prepared: Prepared) -> ModeResult:
    """The same work as a plain PySpark script in one warm session, with delta-spark."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from warehouse.spark import delta_jars

    root = prepared.folder / "plain"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shape = prepared.shape
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("plain")
        .config("spark.jars", ",".join(delta_jars()))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config(
            "spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )
        .config("spark.databricks.delta.snapshotPartitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config(map=dict[str, Any](SPARK_CONF))
        .getOrCreate()
    )
    types = {"bigint": T.LongType(), "double": T.DoubleType(), "timestamp": T.TimestampType()}
    schema = T.StructType(
        [T.StructField(f.name, types[_SPARK_TYPES[f.type]]) for f in prepared.stream_schema]
    )
    master_path = str(root / "master")
    spark.read.parquet(str(prepared.master_file)).write.format("delta").save(master_path)
    result = ModeResult("plain")
    for index, source in enumerate(prepared.stream_files):
        landed = root / "landing" / source.name
        deliver(source, landed.parent)
        started = time.perf_counter()
        reader = spark.read.schema(schema)
        batch = (
            reader.parquet(str(landed))
            if shape.stream_format == "parquet"
            else reader.json(str(landed))
        )
        master = spark.read.format("delta").load(master_path)
        for join in shape.joins:
            joined = plain_join(batch, master, join, F)
            checked = joined.agg(
                F.count(F.lit(1)).alias("rows"),
                *[
                    F.sum(((F.col(c) < lo) | (F.col(c) > hi)).cast("int")).alias(f"bad_{c}")
                    for c, (lo, hi) in shape.checks.items()
                ],
                F.sum(F.col(shape.stream_id).isNull().cast("int")).alias("null_ids"),
            ).first()
            assert checked is not None
            bad = {k: v for k, v in checked.asDict().items() if k != "rows" and v}
            if bad:
                raise RuntimeError(f"plain: checks failed for {join.name}: {bad}")
            joined.write.format("delta").mode("append").save(str(root / "gold" / join.name))
        result.interval_seconds.append(time.perf_counter() - started)
        logger.info("plain: interval %d in %.2fs", index, result.interval_seconds[-1])
    from deltalake import DeltaTable

    for join in shape.joins:
        columns = compare_columns(prepared)
        table = DeltaTable(str(root / "gold" / join.name)).to_pyarrow_table(columns=columns)
        result.rows[join.name] = _sorted_rows(table, columns)
    spark.stop()
    return result


def plain_join(batch: Any, master: Any, join: Join, F: Any) -> Any:  # noqa: N803
    """The join as a user writes it: broadcast the small side; a band as binned buckets."""
    how = "left" if join.join == "left" else "inner"
    if isinstance(join, EquiJoin):
        return batch.join(
            F.broadcast(master), batch[join.stream_key] == master[join.master_key], how
        )
    if isinstance(join, RangeJoin):
        condition = (batch[join.stream_column] >= master[join.lo]) & (
            batch[join.stream_column] < master[join.hi]
        )
        return batch.join(F.broadcast(master), condition, how)
    eps = join.eps
    stream = batch.withColumn("_bin", F.floor(F.col(join.stream_column) / eps))
    master_bins = master.withColumn(
        "_bin",
        F.explode(F.array(*[F.floor(F.col(join.master_column) / eps) + d for d in (-1, 0, 1)])),
    )
    joined = stream.join(
        master_bins,
        (stream["_bin"] == master_bins["_bin"])
        & (F.abs(stream[join.stream_column] - master_bins[join.master_column]) <= eps),
        how,
    )
    return joined.drop("_bin")


def run_duckdb(prepared: Prepared) -> ModeResult:
    """The same joins and checks in DuckDB over the same files, writing Parquet."""
    import duckdb

    root = prepared.folder / "duckdb"
    shutil.rmtree(root, ignore_errors=True)
    (root / "gold").mkdir(parents=True)
    shape = prepared.shape
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute(f"CREATE TABLE master AS SELECT * FROM '{prepared.master_file}'")
    duck_types = {"bigint": "BIGINT", "double": "DOUBLE", "timestamp": "TIMESTAMPTZ"}
    declared = ", ".join(
        f"'{f.name}': '{duck_types[_SPARK_TYPES[f.type]]}'" for f in prepared.stream_schema
    )
    result = ModeResult("duckdb")
    for index, source in enumerate(prepared.stream_files):
        started = time.perf_counter()
        read = (
            f"read_parquet('{source}')"
            if shape.stream_format == "parquet"
            else f"read_json('{source}', columns = {{{declared}}})"
        )
        con.execute(
            "CREATE OR REPLACE TEMP VIEW batch AS SELECT * REPLACE "
            f"(event_time::TIMESTAMP AS event_time) FROM {read}"
        )
        for join in shape.joins:
            how = "LEFT JOIN" if join.join == "left" else "JOIN"
            if isinstance(join, EquiJoin):
                on = f"b.{join.stream_key} = m.{join.master_key}"
            elif isinstance(join, RangeJoin):
                on = f"b.{join.stream_column} >= m.{join.lo} AND b.{join.stream_column} < m.{join.hi}"
            else:
                on = (
                    f"m.{join.master_column} BETWEEN b.{join.stream_column} - {join.eps} "
                    f"AND b.{join.stream_column} + {join.eps}"
                )
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE joined AS SELECT * FROM batch b {how} master m ON {on}"
            )
            checks = " + ".join(
                f"count(*) FILTER (WHERE {c} < {lo} OR {c} > {hi})"
                for c, (lo, hi) in shape.checks.items()
            )
            bad = con.execute(f"SELECT {checks} FROM joined").fetchone()
            if bad and bad[0]:
                raise RuntimeError(f"duckdb: checks failed for {join.name}")
            con.execute(
                f"COPY joined TO '{root / 'gold' / f'{join.name}-{index:04d}.parquet'}' (FORMAT parquet)"
            )
        result.interval_seconds.append(time.perf_counter() - started)
    for join in shape.joins:
        columns = compare_columns(prepared)
        files = sorted((root / "gold").glob(f"{join.name}-*.parquet"))
        table = pa.concat_tables([pq.read_table(p) for p in files])
        result.rows[join.name] = _sorted_rows(table.select(columns), columns)
    return result


MODES: dict[str, Callable[[Prepared], ModeResult]] = {
    "tasks": run_tasks,
    "warm": run_warm,
    "plain": run_plain,
    "duckdb": run_duckdb,
}


def check_equal(shape: Shape, results: Sequence[ModeResult]) -> list[str]:
    """Every mode published the same rows, as multisets; the differences otherwise."""
    problems = []
    first = results[0]
    for other in results[1:]:
        for join in shape.joins:
            mine, theirs = first.rows[join.name], other.rows[join.name]
            if mine != theirs:
                problems.append(
                    f"{shape.name} {join.name}: {first.mode} published {len(mine)} row(s), "
                    f"{other.mode} {len(theirs)}, and they differ"
                )
    return problems


def report(shape: Shape, results: Sequence[ModeResult], commit: str) -> list[str]:
    """The shape's markdown table: steady-state seconds per interval and ratios to plain."""
    by_mode = {r.mode: r for r in results}
    plain = by_mode.get("plain")
    lines = [
        f"### {shape.name}: {shape.description}",
        "",
        f"Commit {commit}; {len(results[0].interval_seconds)} intervals per mode, the first "
        "is warm-up; seconds are medians of the others.",
        "",
        "| mode | s / interval | vs plain | phases (median s) | every interval (s) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r.steady() / plain.steady():.2f}x" if plain and plain.steady() else "-"
        phases = ", ".join(
            f"{name} {statistics.median(values[1:] or values):.2f}"
            for name, values in r.phases.items()
        )
        if r.process_start is not None:
            starts = len(r.phases)
            phases += f"; process start {r.process_start:.2f} x {starts} task(s)"
            if plain and plain.steady():
                work = r.steady() - starts * r.process_start
                phases += f" (without it: {work:.2f} s, {work / plain.steady():.2f}x)"
        every = ", ".join(f"{v:.2f}" for v in r.interval_seconds)
        lines.append(f"| {r.mode} | {r.steady():.2f} | {ratio} | {phases or '-'} | {every} |")
    return lines


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--intervals", type=int, default=4, help="intervals per mode (>= 2)")
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "interval_cost")
    parser.add_argument("--out", type=Path, default=None, help="markdown table to write")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pipeline config setting for the pipeline modes, e.g. stages.*.operator.mode=ssbj",
    )
    args = parser.parse_args(argv)
    if args.intervals < 2:
        parser.error("--intervals: at least 2 (the first is warm-up)")
    OVERRIDES[:] = args.overrides
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    commit = _commit()
    lines: list[str] = []
    problems: list[str] = []
    for name in args.shapes:
        shape = SHAPES[name]
        prepared = prepare(shape, args.work / name, args.intervals, args.work / "tpch")
        # The plain job runs first: its session loads delta-spark's jars into the process's
        # JVM, which only the first session of a process can do (the pipeline's sessions
        # leave them off for the embedded engine, and a later session reuses that JVM).
        order = sorted(args.modes, key=lambda mode: mode != "plain")
        done = {mode: MODES[mode](prepared) for mode in order}
        results = [done[mode] for mode in args.modes]
        problems += check_equal(shape, results)
        lines += [*report(shape, results, commit), ""]
        print("\n".join(lines[-len(results) - 7 :]), flush=True)
    if args.overrides:
        lines.append(f"Pipeline settings: {' '.join(args.overrides)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    for problem in problems:
        logger.error("%s", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
