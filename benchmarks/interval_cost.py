"""What a scheduled interval costs, end to end, against the same work written plainly.

    python -m benchmarks.interval_cost [--shapes demo equi20k ...] [--intervals 4]
                                       [--modes tasks warm plain duckdb] [--bound 1]
                                       [--set KEY=VALUE ...]
                                       [--object-store [--landing-in-store]]
                                       [--out benchmarks/results/interval-cost.md]

Each shape is a pipeline config, its masters and one file per stream per interval:
``demo`` is ``configs/demo.yaml`` as it is (two streams, three stages of which one reads
another's output, its Great Expectations suites); the others are built from their stages
with the operators' defaults. The same files go through four modes, one after the other,
each in a fresh warehouse:

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
stream tuple id and the master columns), or the benchmark fails. Modes are compared at
equal freshness: each must publish every tuple within ``--bound`` runs of the one that
ingested it (the pipeline's ``freshness.complete_within``, 1 interval by default; set a
longer one for the pipeline with ``--set``), or the benchmark fails; whatever a pipeline
still holds after the last interval is drained, and the drain is counted (``with
drain``); each table gives the tuple waits from landing to gold (:class:`WaitClock`).
The first intervals of each mode (``--warmup``, 1 by default) are warm-up (the first touch
of each table, the JIT compiling each code path in the mode's new JVM); the table reports
the median of the others, the steady state of a scheduled pipeline whose worker stays up,
and the ratios against ``plain`` in the same run. The modes run interleaved (:func:`run_interleaved`), each in a
process and a JVM of its own: every mode's interval 0, then every mode's interval 1, one
mode working at a time, so the machine's drift over the run falls on all of them alike and
none runs on code another mode's work compiled.

With ``--object-store`` the run starts a SeaweedFS server on loopback
(:mod:`warehouse.object_store_server`) and every mode's tables go to a bucket of its
own there: the pipeline modes' warehouse root (``s3://<bucket>/warehouse``, the driver's
files in a local folder), the plain job's masters and Delta outputs. The ``AWS_*``
variables that point at the server are set in this process, so the ``tasks`` mode's
processes and the warm worker inherit them. Landing zones stay local unless
``--landing-in-store`` puts each mode's in a second bucket of its own; ``duckdb`` reads and
writes local files either way. The server counts the requests of each bucket by type
(:meth:`~warehouse.object_store_server.S3Server.request_counts`); a second table gives
each mode's requests per interval, read before and after each interval's timed work, and
those of the first intervals after the warm-up against the last ones (does an interval
cost more requests as the tables age?).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from benchmarks.revision import short_commit
from warehouse.object_store import is_object_store, storage_options

if TYPE_CHECKING:
    from warehouse.object_store_server import S3Server

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


Predicate = EquiJoin | BandJoin | RangeJoin


@dataclass(frozen=True)
class Checks:
    """What every mode checks on an output batch before it appends it: the plain modes as
    one aggregate, the pipeline through its quality gate (plus ``suite``'s expectations)."""

    value_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    value_sets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    not_null: tuple[str, ...] = ()
    unique: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stage:
    """One stage: ``predicate`` joins ``input`` (a stream or an earlier stage's output) to
    ``master`` and writes ``output``."""

    input: str
    master: str
    predicate: Predicate
    output: str = ""
    checks: Checks = field(default_factory=Checks)

    @property
    def name(self) -> str:
        return self.predicate.name

    @property
    def published(self) -> str:
        return self.output or self.predicate.name


@dataclass(frozen=True)
class Stream:
    """A stream: its tuple id and how to make interval ``index``'s file from the masters
    (``make(masters, index, rng, cache)``; ``cache`` holds the generated TPC-H files)."""

    name: str
    id_column: str
    make: Callable[[dict[str, pa.Table], int, np.random.Generator, Path], pa.Table]
    format: str = "json"


@dataclass(frozen=True)
class Master:
    name: str
    keys: tuple[str, ...]
    make: Callable[[Path], pa.Table]


@dataclass(frozen=True)
class Shape:
    """One benchmark shape: streams, masters and the stages joining them, in DAG order.

    ``config`` names a pipeline config to run as it is (its paths moved into the mode's
    folder); without it the config is built from the stages with default operators."""

    name: str
    description: str
    streams: tuple[Stream, ...]
    masters: tuple[Master, ...]
    stages: tuple[Stage, ...]
    config: Path | None = None


def _tpch(scale: float, cache: Path, table: str) -> pa.Table:
    from demo.data import _plain, generate_tpch

    return _plain(pq.read_table(generate_tpch(scale, cache, (table,)) / f"{table}.parquet"))


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
    return _lineitems(keys, index, rng)


def zipf_lineitem_stream(
    master: pa.Table, index: int, rng: np.random.Generator, rows: int, z: float
) -> pa.Table:
    """``rows`` lineitem-like tuples whose part keys follow Zipf(``z``) over the master's
    part keys (rank r drawn with probability ~ 1 / r^z; every key has master rows)."""
    parts = np.unique(master.column("ps_partkey").to_numpy())
    weights = 1.0 / np.arange(1, len(parts) + 1) ** z
    ranked = np.random.default_rng(7).permutation(parts)  # the same hot keys every interval
    keys = rng.choice(ranked, size=rows, p=weights / weights.sum())
    return _lineitems(keys, index, rng)


def _lineitems(keys: np.ndarray, index: int, rng: np.random.Generator) -> pa.Table:
    """Lineitem-like tuples of part ``keys``, ids unique across intervals, with event times
    inside interval ``index``."""
    rows = len(keys)
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


def partsupp_stage(output: str, how: str) -> Stage:
    """The lineitem stream's equi stage to TPC-H partsupp on the part key."""
    join = EquiJoin(output, how, "l_partkey", "ps_partkey")
    return Stage("li", "partsupp", join, checks=Checks(value_ranges={"l_quantity": (1, 50)}))


def equi_shape(name: str, description: str, scale: float, rows: int) -> Shape:
    return Shape(
        name=name,
        description=description,
        streams=(
            Stream(
                "li",
                "l_id",
                lambda masters, index, rng, cache: lineitem_stream(
                    masters["partsupp"], index, rng, rows
                ),
            ),
        ),
        masters=(Master("partsupp", ("ps_partkey", "ps_suppkey"), partsupp_master(scale)),),
        stages=(partsupp_stage("li_inner", "inner"), partsupp_stage("li_left", "left")),
    )


def user_shape(name: str, description: str, scale: float, rows: int) -> Shape:
    """A new user's first pipeline: one Parquet file of Zipf(1) lineitem tuples an interval,
    one inner equi stage to TPC-H partsupp with the operator at its defaults."""
    stream = Stream(
        "li",
        "l_id",
        lambda masters, index, rng, cache: zipf_lineitem_stream(
            masters["partsupp"], index, rng, rows, 1.0
        ),
        format="parquet",
    )
    return Shape(
        name=name,
        description=description,
        streams=(stream,),
        masters=(Master("partsupp", ("ps_partkey", "ps_suppkey"), partsupp_master(scale)),),
        stages=(partsupp_stage("li_parts", "inner"),),
    )


def theta_shape(
    name: str, description: str, rows: int, master: Master, predicate: BandJoin | RangeJoin
) -> Shape:
    return Shape(
        name=name,
        description=description,
        streams=(
            Stream(
                "ord", "o_id", lambda masters, index, rng, cache: orders_stream(index, rng, rows)
            ),
        ),
        masters=(master,),
        stages=(
            Stage(
                "ord",
                master.name,
                predicate,
                checks=Checks(value_ranges={"o_totalprice": (0, 600_000)}),
            ),
        ),
    )


DEMO_SCALE = 0.01
DEMO_ORDERS = 5_000
DEMO_LINEITEMS = 5_000


def demo_master(name: str) -> Callable[[Path], pa.Table]:
    """One of the demo's masters as ``enrich demo-data`` makes it (TPC-H SF0.01)."""

    def make(cache: Path) -> pa.Table:
        from demo.data import generate_tpch, master_tables

        return master_tables(generate_tpch(DEMO_SCALE, cache), seed=7)[name]

    return make


def demo_stream(
    source: str, rows: int, id_column: str, columns: dict[str, pa.DataType]
) -> Callable[[dict[str, pa.Table], int, np.random.Generator, Path], pa.Table]:
    """Interval ``index``'s file of a demo stream: ``rows`` rows of TPC-H SF0.01's
    ``source`` table drawn with replacement (so every order has its customer and an order
    date under the promotions, every line item its part), numbered anew in ``id_column``
    so that an id is never re-sent."""

    def make(
        masters: dict[str, pa.Table], index: int, rng: np.random.Generator, cache: Path
    ) -> pa.Table:
        from demo.data import _plain, generate_tpch

        table = _plain(pq.read_table(generate_tpch(DEMO_SCALE, cache) / f"{source}.parquet"))
        picked = table.take(pa.array(rng.integers(0, table.num_rows, size=rows)))
        first_id = index * rows
        ids = pa.array(np.arange(first_id, first_id + rows), pa.int64())
        built = pa.table(
            {id_column: ids, **{c: picked.column(c).cast(t) for c, t in columns.items()}}
        )
        return _with_event_time(built, index, rng)

    return make


def demo_shape() -> Shape:
    """``configs/demo.yaml`` as it is (its operators and its suites), on its TPC-H masters,
    with 5k orders and 5k line items an interval (the demo's own files)."""
    priorities = ("1-URGENT", "2-HIGH", "3-MEDIUM", "4-NOT SPECIFIED", "5-LOW")
    return Shape(
        name="demo",
        description=(
            f"configs/demo.yaml: {DEMO_ORDERS // 1000}k orders (SSBJ left to customer, then "
            f"A-DSP/auto range to promotions) and {DEMO_LINEITEMS // 1000}k line items (SSBJ "
            "inner to partsupp) an interval, with the demo's suites"
        ),
        streams=(
            Stream(
                "orders",
                "o_orderkey",
                demo_stream(
                    "orders",
                    DEMO_ORDERS,
                    "o_orderkey",
                    {
                        "o_custkey": pa.int64(),
                        "o_totalprice": pa.float64(),
                        "o_orderdate": pa.date32(),
                        "o_orderpriority": pa.string(),
                    },
                ),
            ),
            Stream(
                "lineitem",
                "l_id",
                demo_stream(
                    "lineitem",
                    DEMO_LINEITEMS,
                    "l_id",
                    {
                        "l_orderkey": pa.int64(),
                        "l_partkey": pa.int64(),
                        "l_quantity": pa.float64(),
                        "l_extendedprice": pa.float64(),
                    },
                ),
            ),
        ),
        masters=(
            Master("customer", ("c_custkey",), demo_master("customer")),
            Master("partsupp", ("ps_partkey", "ps_suppkey"), demo_master("partsupp")),
            Master("promotions", ("promo_id",), demo_master("promotions")),
        ),
        stages=(
            Stage(
                "orders",
                "customer",
                EquiJoin("orders_customer", "left", "o_custkey", "c_custkey"),
                checks=Checks(
                    value_ranges={"o_totalprice": (0, 1_000_000), "c_acctbal": (-1000, 10_000)},
                    not_null=("o_orderkey", "o_custkey", "event_time"),
                    unique=("o_orderkey", "c_custkey"),
                ),
            ),
            Stage(
                "orders_customer",
                "promotions",
                RangeJoin("orders_promotions", "left", "o_orderdate", "valid_from", "valid_to"),
                output="orders_enriched",
                checks=Checks(
                    value_ranges={"o_totalprice": (0, 1_000_000), "discount": (0, 0.5)},
                    value_sets={"o_orderpriority": priorities},
                    not_null=("o_orderkey", "o_custkey", "event_time"),
                    unique=("o_orderkey", "promo_id"),
                ),
            ),
            Stage(
                "lineitem",
                "partsupp",
                EquiJoin("lineitem_partsupp", "inner", "l_partkey", "ps_partkey"),
                output="lineitem_suppliers",
                checks=Checks(
                    value_ranges={"l_quantity": (1, 50), "ps_supplycost": (0, 1000)},
                    not_null=("l_id", "l_partkey", "ps_partkey", "ps_suppkey", "event_time"),
                    unique=("l_id", "ps_partkey", "ps_suppkey"),
                ),
            ),
        ),
        config=REPO / "configs" / "demo.yaml",
    )


SHAPES: dict[str, Shape] = {
    shape.name: shape
    for shape in (
        demo_shape(),
        equi_shape(
            "equi20k",
            "20k tuples through an inner and a left equi stage, partsupp SF0.125 (100k rows)",
            0.125,
            20_000,
        ),
        user_shape(
            "user20k",
            "a new user's pipeline: 20k Zipf(1) tuples a Parquet file, one inner equi stage "
            "at its defaults, partsupp SF1 (800k rows)",
            1.0,
            20_000,
        ),
        user_shape(
            "user20k_sf10",
            "the new user's pipeline against partsupp SF10 (8M rows)",
            10.0,
            20_000,
        ),
        equi_shape(
            "equi200k",
            "200k tuples through an inner and a left equi stage, partsupp SF1 (800k rows)",
            1.0,
            200_000,
        ),
        theta_shape(
            "range100k",
            "100k orders against 300 price bands (range, left)",
            100_000,
            Master("bands", ("band_id",), price_bands(300)),
            RangeJoin("ord_band", "left", "o_totalprice", "band_lo", "band_hi"),
        ),
        theta_shape(
            "band20k",
            "20k orders against 100k orders within eps = 1 (band, inner)",
            20_000,
            Master("refs", ("r_id",), reference_orders(100_000)),
            BandJoin("ord_near", "inner", "o_totalprice", "r_totalprice", 1.0),
        ),
    )
}


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Prepared:
    """A shape's generated inputs: each master (Parquet) and each stream's file per interval."""

    shape: Shape
    folder: Path
    master_files: dict[str, Path]
    stream_files: dict[str, tuple[Path, ...]]
    master_columns: dict[str, tuple[str, ...]]
    stream_schemas: dict[str, pa.Schema]
    store: ObjectStoreRun | None = None
    """The object store of an ``--object-store`` run (None: every mode on local disk)."""
    warmup: int = 1
    """The first intervals of every mode that are warm-up (``--warmup``): left out of the
    medians, the with-drain sums and the tuple waits."""

    @property
    def intervals(self) -> int:
        return len(next(iter(self.stream_files.values())))

    def id_column(self, stage: Stage) -> str:
        """The id column of the stream whose tuples flow into ``stage``'s output."""
        name = stage.input
        while name not in self.stream_schemas:
            name = next(s for s in self.shape.stages if s.published == name).input
        return next(s.id_column for s in self.shape.streams if s.name == name)

    def columns(self, name: str) -> list[str]:
        """The columns of a stream, or of a stage's output: its input's and its master's."""
        if name in self.stream_schemas:
            return [f.name for f in self.stream_schemas[name]]
        stage = next(s for s in self.shape.stages if name in (s.published, s.name))
        return [*self.columns(stage.input), *self.master_columns[stage.master]]

    def stage_input(self, stage: Stage) -> str:
        """``stage.input`` as a frame name of the plain modes: a stream, or the output that
        the stage named there publishes."""
        for other in self.shape.stages:
            if stage.input in (other.name, other.published):
                return other.published
        return stage.input


def prepare(shape: Shape, folder: Path, intervals: int, cache: Path) -> Prepared:
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "outbox").mkdir(parents=True)
    masters = {m.name: m.make(cache) for m in shape.masters}
    master_files = {}
    for name, table in masters.items():
        master_files[name] = folder / f"{name}.parquet"
        pq.write_table(table, master_files[name])
    rng = np.random.default_rng(7)
    files: dict[str, list[Path]] = {s.name: [] for s in shape.streams}
    schemas: dict[str, pa.Schema] = {}
    for index in range(intervals):
        for stream in shape.streams:
            table = stream.make(masters, index, rng, cache)
            schemas[stream.name] = table.schema
            stem = folder / "outbox" / f"{stream.name}-{index:04d}"
            files[stream.name].append(_write_stream(table, stem, stream))
    return Prepared(
        shape,
        folder,
        master_files,
        {name: tuple(paths) for name, paths in files.items()},
        {name: tuple(table.column_names) for name, table in masters.items()},
        schemas,
    )


@dataclass
class ObjectStoreRun:
    """The S3 server of an ``--object-store`` run: every mode's tables in a bucket of its
    own (and, with ``landing_in_store``, its landing zones in another), so that the
    server's request counters tell the modes apart."""

    server: S3Server
    landing_in_store: bool = False
    _client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = self.server.client()
        return self._client


@dataclass(frozen=True)
class Placement:
    """Where one mode keeps its tables (``tables``) and its landing zones (``landing``):
    folders under its local ``root``, or ``s3://`` locations in the buckets named in
    ``buckets`` (``tables``, ``landing``: what is counted)."""

    root: Path
    tables: str
    landing: str
    buckets: dict[str, str] = field(default_factory=dict)


def place(prepared: Prepared, mode: str, root: Path, tables: str) -> Placement:
    """A fresh placement for ``mode``: its tables in ``root/tables`` (``tables`` empty: in
    ``root`` itself), or in a new bucket of the run's object store."""
    store = prepared.store
    local_tables = str(root / tables) if tables else str(root)
    if store is None:
        return Placement(root, local_tables, str(root / "landing"))
    shape = prepared.shape.name.replace("_", "-")
    bucket = store.server.create_bucket(f"{shape}-{mode}")
    buckets = {"tables": bucket}
    landing = str(root / "landing")
    if store.landing_in_store:
        buckets["landing"] = store.server.create_bucket(f"{shape}-{mode}-landing")
        landing = f"s3://{buckets['landing']}/landing"
    where = f"s3://{bucket}/{tables}" if tables else f"s3://{bucket}"
    logger.info("%s: tables in %s, landing zones in %s", mode, where, landing)
    return Placement(root, where, landing, buckets)


def at(location: str, *parts: str) -> str:
    """``parts`` below a folder or an ``s3://`` location (a Path would fold its ``//``)."""
    if is_object_store(location):
        return "/".join([location.rstrip("/"), *parts])
    return str(Path(location, *parts))


def _write_stream(table: pa.Table, stem: Path, stream: Stream) -> Path:
    if stream.format == "parquet":
        path = stem.with_suffix(".parquet")
        pq.write_table(table, path)
        return path
    path = stem.with_suffix(".json")
    with path.open("w") as handle:
        for row in table.to_pylist():
            row["event_time"] = row["event_time"].strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            handle.write(json.dumps(row, default=str) + "\n")
    return path


_SPARK_TYPES = {
    pa.int64(): "bigint",
    pa.float64(): "double",
    pa.string(): "string",
    pa.date32(): "date",
    pa.timestamp("us"): "timestamp",
}


def pipeline_config(prepared: Prepared, where: Placement) -> dict[str, Any]:
    shape = prepared.shape
    if shape.config is not None:
        return _moved_config(shape, where)
    stages: list[dict[str, Any]] = []
    for stage in shape.stages:
        join = stage.predicate
        entry: dict[str, Any] = {
            "name": stage.name,
            "input": stage.input,
            "master": stage.master,
            "join": join.join,
            "output": stage.published,
        }
        if isinstance(join, EquiJoin):
            entry |= {"kind": "equi", "join_on": {join.stream_key: join.master_key}}
        elif isinstance(join, BandJoin):
            entry |= {
                "kind": "theta",
                "predicate": {
                    "type": "band",
                    "stream_column": join.stream_column,
                    "master_column": join.master_column,
                    "eps": join.eps,
                },
            }
        else:
            entry |= {
                "kind": "theta",
                "predicate": {
                    "type": "range",
                    "stream_column": join.stream_column,
                    "lo": join.lo,
                    "hi": join.hi,
                },
            }
        stages.append(entry)
    streams = {}
    for stream in shape.streams:
        columns = [
            {
                "name": f.name,
                "type": _SPARK_TYPES[f.type],
                "nullable": f.name not in (stream.id_column, "event_time"),
            }
            for f in prepared.stream_schemas[stream.name]
        ]
        streams[stream.name] = {
            "landing": at(where.landing, stream.name),
            "format": stream.format,
            "event_time": "event_time",
            "id_column": stream.id_column,
            "columns": columns,
        }
    return {
        "name": "bench",
        "warehouse": _warehouse(where),
        "spark": {"master": "local[2]", "conf": SPARK_CONF},
        "schedule": {"interval": "1h", "start": FIRST_INTERVAL.isoformat(), "retries": 0},
        "streams": streams,
        "masters": {
            master.name: {
                "table": f"masters/{master.name}",
                "keys": list(master.keys),
                "columns": list(prepared.master_columns[master.name]),
            }
            for master in shape.masters
        },
        "stages": stages,
        "quality": {
            stage.published: {"value_ranges": dict(stage.checks.value_ranges)}
            for stage in shape.stages
        },
    }


def _warehouse(where: Placement) -> dict[str, Any]:
    """The warehouse keys of a mode's config: its root, and for a root in the object store
    a local folder of the mode's own for the driver's files."""
    if is_object_store(where.tables):
        return {"root": where.tables, "local_root": str(where.root / "local")}
    return {"root": where.tables}


def _moved_config(shape: Shape, where: Placement) -> dict[str, Any]:
    """``shape.config`` with its warehouse and landing zones where ``where`` puts them and
    its suites where the repository keeps them; everything else (operators, suites, Spark)
    as it is."""
    assert shape.config is not None
    config: dict[str, Any] = yaml.safe_load(shape.config.read_text())
    config["warehouse"] |= _warehouse(where)
    for name, stream in config["streams"].items():
        stream["landing"] = at(where.landing, name)
    config["expectations_dir"] = str(REPO / "expectations")
    return config


def write_master_delta(prepared: Prepared, name: str, location: str) -> None:
    """A master as a Delta table with its change feed on, as the demo writes masters."""
    from deltalake import write_deltalake

    write_deltalake(
        location,
        pq.read_table(prepared.master_files[name]),
        configuration={"delta.enableChangeDataFeed": "true"},
        storage_options=storage_options(location),
    )


def deliver(source: Path, landing: Path) -> None:
    """Place one file atomically (temp name, then rename), as a producer must."""
    landing.mkdir(parents=True, exist_ok=True)
    staging = landing / f"_{source.name}.tmp"
    shutil.copyfile(source, staging)
    os.replace(staging, landing / source.name)


def deliver_interval(prepared: Prepared, index: int, landing: str) -> None:
    """Every stream's file of interval ``index`` into ``landing/<stream>`` (in an object
    store one PUT each, which is atomic)."""
    for name, files in prepared.stream_files.items():
        if is_object_store(landing):
            from warehouse.object_store import ObjectLocation

            assert prepared.store is not None
            target = ObjectLocation.parse(at(landing, name, files[index].name))
            prepared.store.client().put_object(
                Bucket=target.bucket, Key=target.key, Body=files[index].read_bytes()
            )
        else:
            deliver(files[index], Path(landing) / name)


# ---------------------------------------------------------------------------- pacing

Pace = Callable[[], None]
"""Called by a mode before each timed step (an interval, the drain): returns when it is
the mode's turn (:func:`run_interleaved`)."""


def no_pace() -> None:
    """A mode run on its own takes its steps one after another."""


@dataclass(frozen=True)
class ModeFailed:
    mode: str
    error: str


def _mode_process(mode: str, prepared: Prepared, conn: Connection) -> None:
    """One mode's whole run in a process of its own, a step at a time when told to."""

    def pace() -> None:
        conn.send("ready")
        conn.recv()

    try:
        conn.send(MODES[mode](prepared, pace))
    except BaseException:  # noqa: BLE001 - the parent reports it, with the traceback
        conn.send(ModeFailed(mode, traceback.format_exc()))
    finally:
        conn.close()


def run_interleaved(prepared: Prepared, modes: Sequence[str]) -> dict[str, ModeResult]:
    """Run ``modes`` side by side, each in a process (and so a JVM) of its own, taking
    their steps in turn: interval 0 of every mode, then interval 1 of every mode (each
    round starting one mode later), and so on. Whatever the machine does over the run
    (its load, the page cache, thermal drift) falls on every mode alike, and no mode
    inherits another's JIT-compiled code or heap. Only one mode works at a time: the
    others wait between steps, and each mode's set-up runs before the next one starts.
    """
    context = multiprocessing.get_context("fork")  # the prepared shape holds closures
    conns: dict[str, Connection] = {}
    processes: dict[str, multiprocessing.process.BaseProcess] = {}
    results: dict[str, ModeResult] = {}
    try:
        for mode in modes:
            parent, child = context.Pipe()
            process = context.Process(
                target=_mode_process, args=(mode, prepared, child), name=f"bench-{mode}"
            )
            process.start()
            child.close()
            processes[mode], conns[mode] = process, parent
            _next_message(mode, parent, process)  # set up and ready for its first step
        turn = 0
        while len(results) < len(modes):
            waiting = [mode for mode in modes if mode not in results]
            first = turn % len(waiting)
            for mode in waiting[first:] + waiting[:first]:
                conns[mode].send("go")
                message = _next_message(mode, conns[mode], processes[mode])
                if isinstance(message, ModeResult):
                    results[mode] = message
            turn += 1
    finally:
        for each in processes.values():
            if len(results) < len(modes) and each.is_alive():
                each.terminate()  # a mode failed: the others wait for a turn forever
            each.join()
    return results


def _next_message(
    mode: str, conn: Connection, process: multiprocessing.process.BaseProcess
) -> object:
    try:
        message = conn.recv()
    except EOFError:
        process.join()
        raise RuntimeError(
            f"mode {mode}'s process ended without its result (exit code "
            f"{process.exitcode}; -9: killed, the kernel's OOM killer among others)"
        ) from None
    if isinstance(message, ModeFailed):
        raise RuntimeError(f"mode {mode} failed:\n{message.error}")
    if message != "ready" and not isinstance(message, ModeResult):
        raise RuntimeError(f"mode {mode} sent {message!r}, expected 'ready' or its result")
    return message


# ---------------------------------------------------------------------------- results


@dataclass
class ModeResult:
    mode: str
    interval_seconds: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)
    """Seconds per phase per interval (what each mode can tell apart)."""
    rows: dict[str, Path] = field(default_factory=dict)
    """Per output, a Parquet file of the published rows in a canonical form, sorted
    (:func:`canonical_rows`), for the multiset comparison: the modes' processes hand over
    files, as their rows would not fit the memory of one process twice over."""
    process_start: float | None = None
    drain_seconds: float = 0.0
    """What the mode still had to do after the last interval so that every tuple is
    published (the pipeline's drain and its validate; 0 for the plain modes)."""
    waits: list[float] = field(default_factory=list)
    """Each published tuple's wait (per output) in schedule time, from its file's landing
    to the end of the run that published it (:class:`WaitClock`)."""
    runs_waited: list[int] = field(default_factory=list)
    """For each published tuple: later runs it waited beyond the one that ingested it."""
    requests: dict[str, list[dict[tuple[str, str], int]]] = field(default_factory=dict)
    """In an ``--object-store`` run: per bucket (``tables``, ``landing``), per interval, the
    requests the server answered during the interval's timed work, by (type, status code)."""
    buckets: dict[str, str] = field(default_factory=dict)
    load: list[float] = field(default_factory=list)
    """The 1-minute load average when the mode started and when it ended."""
    warmup: int = 1
    """How many of the first intervals are warm-up (:attr:`Prepared.warmup`)."""

    def measured(self) -> list[float]:
        """The seconds of every interval after the warm-up."""
        return self.interval_seconds[self.warmup :] or self.interval_seconds

    def steady(self) -> float:
        return statistics.median(self.measured())

    def add_phase(self, name: str, seconds: float) -> None:
        self.phases.setdefault(name, []).append(seconds)


class WaitClock:
    """The tuple waits of one mode, from landing to gold, in schedule time.

    A tuple of interval ``i`` lands at the start of run ``i`` (its file is delivered, then
    the run's commands start, as a scheduled run starts at its interval's end). After run
    ``j`` ends, every tuple newly in a published table waited ``(j - i)`` intervals plus
    run ``j``'s seconds: the wait a scheduled pipeline's consumer sees. Tuples are counted
    per output (a tuple in two outputs waits twice), by their stream id, once however
    many rows they have there; the warm-up intervals' tuples are left out. Reading gold
    happens outside the timed work.
    """

    def __init__(self, prepared: Prepared, gold: str) -> None:
        self.prepared = prepared
        self.gold = gold
        self.seen: dict[str, np.ndarray] = {}

    def after_run(self, result: ModeResult, run: int, run_seconds: float) -> None:
        from deltalake import DeltaTable

        for stage in self.prepared.shape.stages:
            path = at(self.gold, stage.published)
            options = storage_options(path)
            if not DeltaTable.is_deltatable(path, storage_options=options):
                continue
            id_column = self.prepared.id_column(stage)
            table = DeltaTable(path, storage_options=options).to_pyarrow_table(
                columns=[id_column, "event_time"]
            )
            ids = table.column(id_column).to_numpy()
            seen = self.seen.get(stage.published, np.empty(0, ids.dtype))
            fresh = ~np.isin(ids, seen)
            ids, first = np.unique(ids[fresh], return_index=True)
            times = table.column("event_time").to_numpy()[fresh][first]
            landed = ((times - np.datetime64(FIRST_INTERVAL)) // np.timedelta64(INTERVAL)).astype(
                np.int64
            )
            # The warm-up intervals' tuples are left out, as their seconds are.
            waited = (run - landed)[landed >= self.prepared.warmup]
            result.runs_waited += waited.tolist()
            result.waits += (waited * INTERVAL.total_seconds() + run_seconds).tolist()
            self.seen[stage.published] = np.concatenate([seen, ids])


@contextlib.contextmanager
def timed(result: ModeResult, phase: str) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        result.add_phase(phase, time.perf_counter() - started)


@contextlib.contextmanager
def counted(prepared: Prepared, where: Placement, result: ModeResult) -> Iterator[None]:
    """The object-store requests of each of ``where``'s buckets during the block, added to
    ``result.requests`` as one interval's (nothing without an object store). The counters
    are read outside the timed work: wrap the block that starts and stops the clock."""
    store = prepared.store
    if store is None:
        yield
        return
    result.buckets = dict(where.buckets)
    before = {what: store.server.request_counts_by_code(b) for what, b in where.buckets.items()}
    yield
    for what, bucket in where.buckets.items():
        after = store.server.request_counts_by_code(bucket)
        spent = {k: v - before[what].get(k, 0) for k, v in after.items()}
        result.requests.setdefault(what, []).append({k: v for k, v in spent.items() if v})


# ---------------------------------------------------------------------------- pipeline modes


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``KEY=VALUE`` settings (dotted keys, ``*`` for every list item or mapping value, YAML
    values) on top of the shape's config, e.g. ``stages.*.operator.mode=baseline`` or
    ``quality.*.in_memory_max_rows=0``."""
    for item in overrides:
        key, _, text = item.partition("=")
        value = yaml.safe_load(text)
        targets: list[Any] = [config]
        parts = key.split(".")
        for part in parts[:-1]:
            nxt: list[Any] = []
            for target in targets:
                if part == "*":
                    nxt.extend(target.values() if isinstance(target, dict) else target)
                elif isinstance(target, list):
                    nxt.append(target[int(part)])
                else:
                    nxt.append(target.setdefault(part, {}))
            targets = nxt
        for target in targets:
            target[parts[-1]] = value
    return config


OVERRIDES: list[str] = []


def _pipeline_folder(prepared: Prepared, mode: str) -> tuple[Placement, Path]:
    root = prepared.folder / mode
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    where = place(prepared, mode, root, "warehouse")
    config = apply_overrides(pipeline_config(prepared, where), OVERRIDES)
    config_path = root / "pipeline.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    masters = yaml.safe_load(config_path.read_text())["masters"]
    for name, master in masters.items():
        write_master_delta(prepared, name, at(where.tables, master["table"]))
    return where, config_path


def _window(index: int) -> list[str]:
    start = (FIRST_INTERVAL + index * INTERVAL).replace(tzinfo=UTC)
    return ["--start", start.isoformat(), "--end", (start + INTERVAL).isoformat()]


def run_warm(prepared: Prepared, pace: Pace = no_pace) -> ModeResult:
    """Every command of every interval through ``jobs.enrich.main`` in this process."""
    from jobs.enrich import main

    where, config_path = _pipeline_folder(prepared, "warm")
    result = ModeResult("warm", warmup=prepared.warmup, load=[os.getloadavg()[0]])
    base = ["--config", str(config_path)]
    clock = WaitClock(prepared, at(where.tables, "gold"))

    def enrich(*argv: str) -> None:
        code = main([*base, *argv])
        if code != 0:
            raise RuntimeError(f"enrich {' '.join(argv)} exited {code}")

    for index in range(prepared.intervals):
        pace()
        deliver_interval(prepared, index, where.landing)
        with counted(prepared, where, result):
            started = time.perf_counter()
            window = ["--run-id", f"i{index}", *_window(index)]
            with timed(result, "run"):
                enrich("run", *window)
            with timed(result, "validate"):
                enrich("validate", *window)
            result.interval_seconds.append(time.perf_counter() - started)
        clock.after_run(result, index, result.interval_seconds[-1])
        logger.info("warm: interval %d in %.2fs", index, result.interval_seconds[-1])
    # Whatever an operator still holds is joined and published, so every mode has
    # published the same tuples; it counts, as the run after the last interval.
    pace()
    started = time.perf_counter()
    enrich("drain", "--run-id", "final")
    enrich("validate", "--run-id", "final")
    result.drain_seconds = time.perf_counter() - started
    clock.after_run(result, prepared.intervals, result.drain_seconds)
    result.rows = published_rows(prepared, at(where.tables, "gold"), result.mode)
    result.load.append(os.getloadavg()[0])
    return result


def run_tasks(prepared: Prepared, pace: Pace = no_pace) -> ModeResult:
    """Every task of every interval as its own ``enrich`` process, as Airflow runs them."""
    where, config_path = _pipeline_folder(prepared, "tasks")
    result = ModeResult("tasks", warmup=prepared.warmup, load=[os.getloadavg()[0]])
    in_worker = bool(
        yaml.safe_load(config_path.read_text())
        .get("schedule", {})
        .get("worker", {})
        .get("enabled", True)
    )
    result.process_start = process_start_seconds(in_worker)
    stages = [stage.name for stage in prepared.shape.stages]
    via = ["--worker"] if in_worker else []
    clock = WaitClock(prepared, at(where.tables, "gold"))

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

    for index in range(prepared.intervals):
        pace()
        deliver_interval(prepared, index, where.landing)
        window = ["--run-id", f"i{index}", *_window(index)]
        seconds = 0.0
        with counted(prepared, where, result):
            for task, argv in [
                ("ingest", ["ingest"]),
                *[(f"stage {s}", ["stage", s]) for s in stages],
                ("validate", ["validate"]),
            ]:
                took = enrich(*argv, *window)
                result.add_phase(task, took)
                seconds += took
        result.interval_seconds.append(seconds)
        clock.after_run(result, index, seconds)
        logger.info("tasks: interval %d in %.2fs", index, seconds)
    pace()
    result.drain_seconds = enrich("drain", "--run-id", "final")
    result.drain_seconds += enrich("validate", "--run-id", "final")
    clock.after_run(result, prepared.intervals, result.drain_seconds)
    if in_worker:
        from jobs.worker import stop_worker

        stop_worker(config_path)
    result.rows = published_rows(prepared, at(where.tables, "gold"), result.mode)
    result.load.append(os.getloadavg()[0])
    return result


# What a task process of the warm worker's clients pays before it sends its command: its
# imports, the reading of its global options (``jobs.worker_request``) and the logging
# set-up `enrich` does first.
CLIENT_START = (
    "import jobs.enrich, jobs.worker\n"
    "request = jobs.enrich.worker_request(['--config', 'p.yaml', '--worker', 'run'])\n"
    "from common.command_logging import configure_command_logging\n"
    "configure_command_logging(request.log_level, jobs.enrich.PACKAGE_LOGGERS)"
)

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


def published_rows(prepared: Prepared, gold: str, mode: str) -> dict[str, Path]:
    """Every output's published rows (:func:`canonical_rows`), read from ``gold``."""
    from deltalake import DeltaTable

    rows = {}
    for stage in prepared.shape.stages:
        columns = prepared.columns(stage.published)
        path = at(gold, stage.published)
        table = DeltaTable(path, storage_options=storage_options(path)).to_pyarrow_table(
            columns=columns
        )
        rows[stage.published] = canonical_rows(prepared, mode, stage.published, table, columns)
    return rows


def canonical_rows(
    prepared: Prepared, mode: str, output: str, table: pa.Table, columns: Sequence[str]
) -> Path:
    """``columns`` of ``table`` in a form every mode's rows share, sorted (nulls last), in
    a Parquet file: numbers as doubles (an integer equals the same double, as Python
    compares them), timestamps as microseconds since the epoch in UTC (naive ones are
    UTC already), strings as large strings. Equal multisets give equal files' tables."""
    canonical = {}
    for name in columns:
        column = table.column(name)
        kind = column.type
        if pa.types.is_dictionary(kind):
            column = column.cast(kind.value_type)
            kind = kind.value_type
        if pa.types.is_timestamp(kind):
            column = column.cast(pa.timestamp("us", tz=kind.tz)).cast(pa.int64())
        elif pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind):
            column = column.cast(pa.float64())
        elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
            column = column.cast(pa.large_string())
        canonical[name] = column
    rows = pa.table(canonical)
    order = pc.sort_indices(
        rows, sort_keys=[(name, "ascending") for name in columns], null_placement="at_end"
    )
    target = prepared.folder / f"published-{mode}-{output}.parquet"
    pq.write_table(rows.take(order).combine_chunks(), target)
    return target


# ---------------------------------------------------------------------------- plain modes


def run_plain(prepared: Prepared, pace: Pace = no_pace) -> ModeResult:
    """The same work as a plain PySpark script in one warm session, with delta-spark."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from warehouse.object_store import ObjectStore
    from warehouse.spark import delta_jars, with_object_store

    root = prepared.folder / "plain"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    where = place(prepared, "plain", root, "")
    shape = prepared.shape
    jars: dict[str, str] = {"spark.jars": ",".join(delta_jars())}
    if prepared.store is not None:
        # S3A's jars beside delta-spark's, and the store's S3A settings (from the
        # environment this run set): the session reads and writes s3:// through S3A.
        jars = with_object_store(jars, ObjectStore.from_environment())
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("plain")
        .config(map=dict[str, Any](jars))
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
    types = {
        "bigint": T.LongType(),
        "double": T.DoubleType(),
        "string": T.StringType(),
        "date": T.DateType(),
        "timestamp": T.TimestampType(),
    }
    schemas = {
        name: T.StructType([T.StructField(f.name, types[_SPARK_TYPES[f.type]]) for f in schema])
        for name, schema in prepared.stream_schemas.items()
    }
    master_paths = {name: at(where.tables, "masters", name) for name in prepared.master_files}
    for name, path in master_paths.items():
        # Written as the pipeline modes' masters are (delta-rs): a delta-spark write of
        # SF10 partsupp in this session's 1 GiB driver failed ("unread block data").
        write_master_delta(prepared, name, path)
    result = ModeResult("plain", warmup=prepared.warmup, load=[os.getloadavg()[0]])
    gold = at(where.tables, "gold")
    clock = WaitClock(prepared, gold)
    for index in range(prepared.intervals):
        pace()
        deliver_interval(prepared, index, where.landing)
        with counted(prepared, where, result):
            started = time.perf_counter()
            frames = {}
            for stream in shape.streams:
                file_name = prepared.stream_files[stream.name][index].name
                landed = at(where.landing, stream.name, file_name)
                reader = spark.read.schema(schemas[stream.name])
                frames[stream.name] = (
                    reader.parquet(landed) if stream.format == "parquet" else reader.json(landed)
                )
            for stage in shape.stages:
                master = spark.read.format("delta").load(master_paths[stage.master])
                joined = plain_join(frames[prepared.stage_input(stage)], master, stage.predicate, F)
                _check_plain(joined, stage, F)
                joined.write.format("delta").mode("append").save(at(gold, stage.published))
                frames[stage.published] = joined
            result.interval_seconds.append(time.perf_counter() - started)
        clock.after_run(result, index, result.interval_seconds[-1])
        logger.info("plain: interval %d in %.2fs", index, result.interval_seconds[-1])
    from deltalake import DeltaTable

    for stage in shape.stages:
        columns = prepared.columns(stage.published)
        path = at(gold, stage.published)
        table = DeltaTable(path, storage_options=storage_options(path)).to_pyarrow_table(
            columns=columns
        )
        result.rows[stage.published] = canonical_rows(
            prepared, "plain", stage.published, table, columns
        )
    spark.stop()
    result.load.append(os.getloadavg()[0])
    return result


def _check_plain(joined: Any, stage: Stage, F: Any) -> None:  # noqa: N803
    """The stage's checks as one aggregate over the joined batch."""
    checks = stage.checks
    bad = [
        *[
            F.sum(((F.col(c) < lo) | (F.col(c) > hi)).cast("int")).alias(f"out_of_range_{c}")
            for c, (lo, hi) in checks.value_ranges.items()
        ],
        *[
            F.sum((~F.col(c).isin(*values)).cast("int")).alias(f"not_in_set_{c}")
            for c, values in checks.value_sets.items()
        ],
        *[F.sum(F.col(c).isNull().cast("int")).alias(f"null_{c}") for c in checks.not_null],
    ]
    if checks.unique:
        # A struct, so that a left join's unmatched rows (null master key) count as keys.
        key = F.struct(*[F.col(c) for c in checks.unique])
        bad.append((F.count(F.lit(1)) - F.count_distinct(key)).alias("repeated_key"))
    checked = joined.agg(F.count(F.lit(1)).alias("rows"), *bad).first()
    assert checked is not None
    found = {k: v for k, v in checked.asDict().items() if k != "rows" and v}
    if found:
        raise RuntimeError(f"plain: checks failed for {stage.published}: {found}")


def plain_join(batch: Any, master: Any, join: Predicate, F: Any) -> Any:  # noqa: N803
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


def run_duckdb(prepared: Prepared, pace: Pace = no_pace) -> ModeResult:
    """The same joins and checks in DuckDB over the same files, writing Parquet."""
    import duckdb

    root = prepared.folder / "duckdb"
    shutil.rmtree(root, ignore_errors=True)
    (root / "gold").mkdir(parents=True)
    shape = prepared.shape
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for name, path in prepared.master_files.items():
        con.execute(f"CREATE TABLE master_{name} AS SELECT * FROM '{path}'")
    duck_types = {
        "bigint": "BIGINT",
        "double": "DOUBLE",
        "string": "VARCHAR",
        "date": "DATE",
        "timestamp": "TIMESTAMPTZ",
    }
    result = ModeResult("duckdb", warmup=prepared.warmup)
    for index in range(prepared.intervals):
        pace()
        started = time.perf_counter()
        for stream in shape.streams:
            source = prepared.stream_files[stream.name][index]
            declared = ", ".join(
                f"'{f.name}': '{duck_types[_SPARK_TYPES[f.type]]}'"
                for f in prepared.stream_schemas[stream.name]
            )
            read = (
                f"read_parquet('{source}')"
                if stream.format == "parquet"
                else f"read_json('{source}', columns = {{{declared}}})"
            )
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE frame_{stream.name} AS SELECT * REPLACE "
                f"(event_time::TIMESTAMP AS event_time) FROM {read}"
            )
        for stage in shape.stages:
            join = stage.predicate
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
            output = f"frame_{stage.published}"
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE {output} AS SELECT * "
                f"FROM frame_{prepared.stage_input(stage)} b {how} master_{stage.master} m ON {on}"
            )
            bad = con.execute(f"SELECT {_duckdb_checks(stage.checks)} FROM {output}").fetchone()
            if bad and bad[0]:
                raise RuntimeError(f"duckdb: checks failed for {stage.published}")
            target = root / "gold" / f"{stage.published}-{index:04d}.parquet"
            con.execute(f"COPY {output} TO '{target}' (FORMAT parquet)")
        result.interval_seconds.append(time.perf_counter() - started)
    for stage in shape.stages:
        columns = prepared.columns(stage.published)
        files = sorted((root / "gold").glob(f"{stage.published}-*.parquet"))
        table = pa.concat_tables([pq.read_table(p) for p in files])
        result.rows[stage.published] = canonical_rows(
            prepared, "duckdb", stage.published, table, columns
        )
    return result


def _duckdb_checks(checks: Checks) -> str:
    """The number of rows failing the checks, as one SQL expression."""
    terms = [
        *[
            f"count(*) FILTER (WHERE {c} < {lo} OR {c} > {hi})"
            for c, (lo, hi) in checks.value_ranges.items()
        ],
        *[
            f"count(*) FILTER (WHERE {c} NOT IN ({', '.join(repr(v) for v in values)}))"
            for c, values in checks.value_sets.items()
        ],
        *[f"count(*) FILTER (WHERE {c} IS NULL)" for c in checks.not_null],
    ]
    if checks.unique:
        terms.append(f"count(*) - count(DISTINCT ({', '.join(checks.unique)}))")
    return " + ".join(terms) or "0"


MODES: dict[str, Callable[[Prepared, Pace], ModeResult]] = {
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
        for stage in shape.stages:
            mine = pq.read_table(first.rows[stage.published])
            theirs = pq.read_table(other.rows[stage.published])
            if not mine.equals(theirs):
                problems.append(
                    f"{shape.name} {stage.published}: {first.mode} published {mine.num_rows} "
                    f"row(s), {other.mode} {theirs.num_rows}, and they differ"
                )
    return problems


def _wait(seconds: float) -> str:
    hours, rest = divmod(seconds, INTERVAL.total_seconds())
    return f"{int(hours)} h + {rest:.1f} s" if hours else f"{rest:.1f} s"


def waits_column(r: ModeResult) -> str:
    """p50 / p99 / max of the mode's tuple waits (schedule time)."""
    if not r.waits:
        return "-"
    p50, p99, most = np.percentile(np.asarray(r.waits), [50, 99, 100])
    return f"{_wait(p50)} / {_wait(p99)} / {_wait(most)}"


def in_bound(r: ModeResult, bound: int) -> tuple[int, int]:
    """Published tuples answered within ``bound`` runs (the ingesting one and bound - 1
    after it), and all published tuples."""
    waited = np.asarray(r.runs_waited)
    return int((waited < bound).sum()), len(waited)


def check_bound(shape: Shape, results: Sequence[ModeResult], bound: int) -> list[str]:
    """Every mode answered every tuple it published within the bound: the same freshness."""
    problems = []
    for r in results:
        inside, total = in_bound(r, bound)
        if r.waits and inside < total:
            problems.append(
                f"{shape.name} {r.mode}: {total - inside} of {total} published tuple(s) "
                f"waited beyond the bound of {bound} interval(s)"
            )
    return problems


def _with_drain(r: ModeResult) -> float:
    """Every measured interval (the warm-up left out), plus the drain."""
    return sum(r.measured()) + r.drain_seconds


def report(shape: Shape, results: Sequence[ModeResult], commit: str, bound: int) -> list[str]:
    """The shape's markdown table: steady-state seconds per interval and ratios to plain,
    the drains counted, and the tuple waits beside them."""
    by_mode = {r.mode: r for r in results}
    plain = by_mode.get("plain")
    lines = [
        f"### {shape.name}: {shape.description}",
        "",
        f"Commit {commit}; {len(results[0].interval_seconds)} intervals per mode, interleaved, "
        f"each mode in a JVM of its own; the first {results[0].warmup} are warm-up; seconds "
        "are medians of the others. With drain: the measured intervals "
        "plus what the mode ran after the last one until nothing was pending. Tuple wait: "
        f"landing to gold in schedule time (1 interval = {_wait(INTERVAL.total_seconds())}), "
        f"every published tuple of every output; in bound: published within {bound} run(s).",
        "",
        "| mode | s / interval | vs plain | with drain, vs plain | tuple wait p50 / p99 / max "
        "| in bound | phases (median s) | every interval (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r.steady() / plain.steady():.2f}x" if plain and plain.steady() else "-"
        drained = (
            f"{_with_drain(r):.2f} s, {_with_drain(r) / _with_drain(plain):.2f}x"
            if plain and _with_drain(plain)
            else f"{_with_drain(r):.2f} s"
        )
        inside, total = in_bound(r, bound)
        share = f"{inside / total:.1%}" if total else "-"
        phases = ", ".join(
            f"{name} {statistics.median(values[r.warmup :] or values):.2f}"
            for name, values in r.phases.items()
        )
        if r.drain_seconds:
            phases += f"; drain {r.drain_seconds:.2f}"
        if r.process_start is not None:
            starts = len(r.phases)
            phases += f"; process start {r.process_start:.2f} x {starts} task(s)"
            if plain and plain.steady():
                work = r.steady() - starts * r.process_start
                phases += f" (without it: {work:.2f} s, {work / plain.steady():.2f}x)"
        every = ", ".join(f"{v:.2f}" for v in r.interval_seconds)
        lines.append(
            f"| {r.mode} | {r.steady():.2f} | {ratio} | {drained} | {waits_column(r)} | "
            f"{share} | {phases or '-'} | {every} |"
        )
    return lines


# Request types in the order the requests table shows them (others follow, by name).
REQUEST_TYPES = ("LIST", "GET", "PUT", "DELETE", "POST", "COPY")
AGE_TYPES = ("LIST", "GET", "PUT")
AGE_WINDOW = 3
"""Intervals compared for age: ``AGE_WINDOW`` after the warm-up, the same ones of each
later checkpoint cycle, and the last ones."""


def _by_type(counts: dict[tuple[str, str], int]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for (kind, _code), count in counts.items():
        totals[kind] = totals.get(kind, 0) + count
    return totals


def _mean_by_type(intervals: Sequence[dict[tuple[str, str], int]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for counts in intervals:
        for kind, count in _by_type(counts).items():
            totals[kind] = totals.get(kind, 0) + count / len(intervals)
    return totals


def checkpoint_cycle() -> int:
    """Commits between two checkpoints of the pipeline's tables: its
    ``warehouse.checkpoint_interval``, as ``--set`` leaves it (one commit per interval)."""
    from pipeline.config import WarehouseConfig

    settings = [item for item in OVERRIDES if item.startswith("warehouse.checkpoint_interval=")]
    config = apply_overrides({"warehouse": {}}, settings)
    default = WarehouseConfig().checkpoint_interval
    return int(config["warehouse"].get("checkpoint_interval", default))


def age_windows(count: int, cycle: int) -> list[range]:
    """The intervals (0-based) compared for age: ``AGE_WINDOW`` after the warm-up, the same
    ones ``cycle`` intervals later and later again (the same point of the tables'
    checkpoint cycle, so the count a checkpoint resets does not pass for growth), and the
    last ``AGE_WINDOW`` when they are not one of those."""
    windows = [
        range(start, min(count, start + AGE_WINDOW)) for start in range(1, count, max(cycle, 1))
    ]
    windows = [w for w in windows if len(w) == AGE_WINDOW] or windows[:1]
    last = range(max(1, count - AGE_WINDOW), count)
    if windows[-1] != last:
        windows.append(last)
    return windows


def _span(window: range) -> str:
    return f"{window.start + 1}-{window.stop}" if len(window) > 1 else f"{window.stop}"


def requests_report(shape: Shape, results: Sequence[ModeResult], cycle: int) -> list[str]:
    """The shape's requests table (an ``--object-store`` run): each mode's requests per
    interval and bucket by type, the first intervals against the last (the tables' age)."""
    counted_results = [r for r in results if r.requests]
    if not counted_results:
        return []
    kinds = {k for r in counted_results for ivs in r.requests.values() for c in ivs for k, _ in c}
    ordered = [k for k in REQUEST_TYPES if k in kinds] + sorted(kinds - set(REQUEST_TYPES))
    count = len(counted_results[0].interval_seconds)
    windows = age_windows(count, cycle)
    spans = " → ".join(_span(window) for window in windows)
    age = "/".join(AGE_TYPES)
    lines = [
        f"#### {shape.name}: object-store requests per interval",
        "",
        "Counted by the server (SeaweedFS's `SeaweedFS_s3_request_total` of each mode's "
        "bucket) from the start to the end of each interval's timed work; GET includes HEAD "
        "(the server labels HeadObject and HeadBucket GET). Per type: the median of the "
        "intervals after the first. Age: the mean per interval of intervals "
        f"{spans} (1-based; interval 1 is the warm-up; windows {cycle} intervals apart are "
        f"at the same point of the tables' checkpoint cycle, a checkpoint every {cycle} "
        f"commits), {age} and all, and the seconds per interval of the same intervals.",
        "",
        f"| mode | bucket | requests / interval | {' | '.join(ordered)} | not 2xx "
        f"| {age}, intervals {spans} | all, {spans} | s / interval, {spans} "
        "| requests of every interval |",
        "|---|---|---|" + "---|" * len(ordered) + "---|---|---|---|---|",
    ]
    for r in counted_results:
        for what, intervals in r.requests.items():
            steady = intervals[1:] or intervals
            totals = [sum(c.values()) for c in intervals]
            per_type = [
                f"{statistics.median(_by_type(c).get(k, 0) for c in steady):g}" for k in ordered
            ]
            failed = [
                sum(v for (_k, code), v in c.items() if not code.startswith("2")) for c in steady
            ]
            codes = sorted({f"{k} {code}" for c in steady for k, code in c if code[:1] != "2"})
            failed_codes = f" ({', '.join(codes)})" if codes else ""
            means = [_mean_by_type([intervals[i] for i in window]) for window in windows]
            ages = " → ".join("/".join(f"{m.get(k, 0):.1f}" for k in AGE_TYPES) for m in means)
            all_ages = " → ".join(f"{sum(m.values()):.1f}" for m in means)
            s_ages = " → ".join(
                f"{statistics.mean(r.interval_seconds[i] for i in window):.2f}"
                for window in windows
            )
            lines.append(
                f"| {r.mode} | {what} | {statistics.median(totals[1:] or totals):g} | "
                f"{' | '.join(per_type)} | {statistics.median(failed):g}{failed_codes} | "
                f"{ages} | "
                f"{all_ages} | {s_ages} | {', '.join(str(t) for t in totals)} |"
            )
    lines += ["", *_requests_by_interval(counted_results, ordered)]
    loads = [f"{r.mode} {r.load[0]:.2f} → {r.load[-1]:.2f}" for r in results if len(r.load) == 2]
    if loads:
        lines += ["", f"1-minute load average at each mode's start → end: {'; '.join(loads)}."]
    return lines


def _raw_requests(r: ModeResult) -> dict[str, Any]:
    """A mode's requests of every interval as JSON: per bucket, per interval, ``TYPE code``
    to count, with the interval's seconds."""
    return {
        "seconds": [round(v, 3) for v in r.interval_seconds],
        "buckets": r.buckets,
        "requests": {
            what: [{f"{k} {code}": v for (k, code), v in sorted(c.items())} for c in intervals]
            for what, intervals in r.requests.items()
        },
    }


def _requests_by_interval(results: Sequence[ModeResult], ordered: Sequence[str]) -> list[str]:
    """Every interval's requests per mode and bucket, type by type (``ordered``), and its
    seconds: where a count jumps (a checkpoint, a compaction) shows."""
    columns = [(r, what) for r in results for what in r.requests]
    lines = [
        f"Requests of every interval, {'/'.join(ordered)} (seconds):",
        "",
        "| interval | " + " | ".join(f"{r.mode} {what}" for r, what in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for index in range(len(results[0].interval_seconds)):
        cells = []
        for r, what in columns:
            by_type = _by_type(r.requests[what][index])
            cells.append(
                "/".join(str(by_type.get(k, 0)) for k in ordered)
                + f" ({r.interval_seconds[index]:.2f} s)"
            )
        lines.append(f"| {index + 1} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--intervals", type=int, default=4, help="intervals per mode (>= 2)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="the first N intervals of every mode are warm-up, left out of the figures: each "
        "mode's JVM is new, and it compiles the code of each path the first times it runs",
    )
    parser.add_argument(
        "--bound",
        type=int,
        default=1,
        metavar="N",
        help="the freshness bound every mode is held to, in intervals: a mode that "
        "publishes a tuple later fails the run (set the pipeline's with --set "
        "'stages.*.freshness.complete_within=N intervals')",
    )
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
    parser.add_argument(
        "--object-store",
        action="store_true",
        help="start a SeaweedFS server on loopback and keep each mode's tables in a bucket "
        "of its own there; a second table gives each mode's requests per interval",
    )
    parser.add_argument(
        "--landing-in-store",
        action="store_true",
        help="with --object-store: each mode's landing zones in another bucket of its own "
        "(default: local folders)",
    )
    args = parser.parse_args(argv)
    if args.warmup < 1 or args.intervals <= args.warmup:
        parser.error("--warmup: at least 1, and fewer than --intervals")
    if args.landing_in_store and not args.object_store:
        parser.error("--landing-in-store: only with --object-store")
    OVERRIDES[:] = args.overrides
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    commit = short_commit(REPO) or "unknown"
    lines: list[str] = []
    problems: list[str] = []
    raw: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        store = (
            stack.enter_context(_object_store(args.landing_in_store)) if args.object_store else None
        )
        for name in args.shapes:
            shape = SHAPES[name]
            prepared = prepare(shape, args.work / name, args.intervals, args.work / "tpch")
            prepared = replace(prepared, store=store, warmup=args.warmup)
            done = run_interleaved(prepared, args.modes)
            results = [done[mode] for mode in args.modes]
            problems += check_equal(shape, results)
            problems += check_bound(shape, results, args.bound)
            table = report(shape, results, commit, args.bound)
            if store is not None:
                table += ["", *requests_report(shape, results, checkpoint_cycle())]
                raw[name] = {r.mode: _raw_requests(r) for r in results if r.requests}
            lines += [*table, ""]
            print("\n".join(table), flush=True)
    if args.object_store:
        where = "their own buckets" if args.landing_in_store else "local folders"
        lines.append(
            "Object store: SeaweedFS (`weed mini`) on loopback, each mode's tables in a "
            f"bucket of its own, landing zones in {where}; duckdb on local disk."
        )
    if args.overrides:
        lines.append(f"Pipeline settings: {' '.join(args.overrides)}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        if raw:  # every interval's counts by type and status code, beside the tables
            counts = args.out.with_suffix(".requests.json")
            counts.write_text(json.dumps(raw, indent=1, sort_keys=True) + "\n")
    for problem in problems:
        logger.error("%s", problem)
    return 1 if problems else 0


@contextlib.contextmanager
def _object_store(landing_in_store: bool) -> Iterator[ObjectStoreRun]:
    """A SeaweedFS server on loopback for the run, with the ``AWS_*`` variables that point
    at it set in this process (and so in every process it starts) until the block ends."""
    from warehouse.object_store_server import started_s3_server

    server = started_s3_server()
    saved = dict(os.environ)
    try:
        os.environ.update(server.environment())
        logger.info(
            "object store: SeaweedFS at %s (metrics %s)", server.endpoint, server.metrics_url
        )
        yield ObjectStoreRun(server, landing_in_store)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
