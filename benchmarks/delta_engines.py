"""Embedded (delta-rs log + Spark Parquet) vs native (delta-spark) Delta engine, side by side.

    python -m benchmarks.delta_engines [--sizes demo sf1] [--reps 3] [--intervals 2]
                                       [--scale 0.01] [--out benchmarks/results/delta_engines.md]

One Spark session (local[2], the delta-spark jars from ``make jars``) runs both engines on
the same data; every measurement alternates which engine goes first, and the table reports
the median of ``--reps`` repetitions and the ratio native / embedded (above 1: native is
slower). The operations are the pipeline's, at its sizes:

- append: one stream batch into an output table partitioned by ``_interval_start``, with an
  app transaction (every pipeline commit carries one);
- replace: a backfill's atomic replace of one interval partition;
- merge: a master-maintenance upsert (half updates, half inserts) into the master;
- snapshot: the live files of a table's newest version, just committed (every step pins
  the versions it reads and writes);
- read all: the whole master snapshot (a baseline join, the A-DSP layout build);
- read 1/k: the files of one of k = 4 byte-balanced master partitions (an SSBJ step);
- rows added: the rows of the output versions since the last audit (write-audit-publish).

Sizes: ``demo`` is the demo at TPC-H SF 0.01 (customer master 1,500 rows, batches of 1,000
orders), ``sf1`` is the SSBJ benchmark's SF1 (150,000-row master, batches of 20,000).

Then the demo pipeline (configs/demo.yaml, two SSBJ stages and one A-DSP stage with quality
gates) runs ``--intervals`` hourly intervals at TPC-H ``--scale`` on each engine: the table
gives, per interval, the seconds of ``enrich run`` (ingest + one step of every stage) plus
``enrich validate`` (audit + publish), data generation excluded.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from warehouse.delta import AppTransaction, DeltaEngine, PartitionFilter, open_engine
from warehouse.delta.api import EngineChoice
from warehouse.delta.schema import arrow_to_spark
from warehouse.spark import SparkSettings, build_session, has_delta_jars

logger = logging.getLogger("bench")

REPO_ROOT = Path(__file__).resolve().parent.parent
ENGINES: tuple[EngineChoice, ...] = ("embedded", "native")
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
K = 4


@dataclass(frozen=True)
class Size:
    name: str
    master_rows: int
    batch_rows: int
    merge_rows: int


SIZES = {
    "demo": Size("demo", master_rows=1_500, batch_rows=1_000, merge_rows=100),
    "sf1": Size("sf1", master_rows=150_000, batch_rows=20_000, merge_rows=2_000),
}
OPERATIONS = ("append", "replace", "merge", "snapshot", "read all", "read 1/k", "rows added")


def master_table(rows: int, first_key: int = 1, seed: int = 0) -> pa.Table:
    """A customer-like master: key, name, nation, segment, balance."""
    rng = np.random.default_rng(seed)
    keys = np.arange(first_key, first_key + rows, dtype=np.int64)
    return pa.table(
        {
            "c_custkey": keys,
            "c_name": [f"Customer#{k:09d}" for k in keys],
            "c_nationkey": rng.integers(0, 25, rows, dtype=np.int64),
            "c_mktsegment": rng.choice(["AUTOMOBILE", "BUILDING", "FURNITURE"], rows),
            "c_acctbal": np.round(rng.uniform(-999.99, 9999.99, rows), 2),
        }
    )


def output_batch(rows: int, interval: int, seed: int) -> pa.Table:
    """An enriched-orders-like output batch of one interval."""
    rng = np.random.default_rng(seed)
    start = START + dt.timedelta(hours=interval)
    return pa.table(
        {
            "o_orderkey": np.arange(interval * rows, (interval + 1) * rows, dtype=np.int64),
            "o_custkey": rng.integers(1, 150_000, rows, dtype=np.int64),
            "o_totalprice": np.round(rng.uniform(900, 500_000, rows), 2),
            "o_orderpriority": rng.choice(["1-URGENT", "2-HIGH", "3-MEDIUM"], rows),
            "event_time": pa.array(
                [start + dt.timedelta(seconds=int(s)) for s in rng.integers(0, 3600, rows)],
                pa.timestamp("us", tz="UTC"),
            ),
            "c_name": [f"Customer#{k:09d}" for k in rng.integers(1, 150_000, rows)],
            "c_acctbal": np.round(rng.uniform(-999.99, 9999.99, rows), 2),
            "_version_customer": np.full(rows, 1, dtype=np.int64),
            "_interval_start": pa.array([start] * rows, pa.timestamp("us", tz="UTC")),
        }
    )


def frame(spark: SparkSession, table: pa.Table, partitions: int = 2) -> DataFrame:
    return spark.createDataFrame(table, arrow_to_spark(table.schema)).repartition(partitions)


def consume(data: DataFrame) -> int:
    """Read every column of every row (a hash sum), as a join input would."""
    row = data.agg(F.count(F.lit(1)), F.sum(F.xxhash64(*data.columns) % 1_000_003)).first()
    assert row is not None
    return int(row[0])


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


class EngineCase:
    """One engine's tables for one size, and its operations, one repetition at a time."""

    def __init__(self, spark: SparkSession, engine: DeltaEngine, root: Path, size: Size) -> None:
        self.spark, self.engine, self.size = spark, engine, size
        self.master, self.output = str(root / "master"), str(root / "output")
        master = master_table(size.master_rows)
        engine.create_table(self.master, arrow_to_spark(master.schema))
        engine.append(self.master, frame(spark, master, 8))
        first = output_batch(size.batch_rows, 0, 0)
        engine.create_table(self.output, arrow_to_spark(first.schema), ("_interval_start",))
        self.audited = engine.snapshot(self.output).version

    def run(self, operation: str, rep: int) -> float:
        size, engine = self.size, self.engine
        if operation == "append":
            data = frame(self.spark, output_batch(size.batch_rows, rep, rep))
            return timed(lambda: engine.append(self.output, data, AppTransaction("append", rep)))
        if operation == "replace":
            data = frame(self.spark, output_batch(size.batch_rows, rep, 100 + rep))
            where = [PartitionFilter("_interval_start", "=", START + dt.timedelta(hours=rep))]
            txn = AppTransaction("backfill", rep)
            return timed(lambda: engine.replace(self.output, data, where, txn))
        if operation == "merge":
            half = size.merge_rows // 2
            updates = master_table(half, first_key=1 + rep * half, seed=10 + rep)
            inserts = master_table(half, first_key=size.master_rows + 1 + rep * half, seed=rep)
            data = frame(self.spark, pa.concat_tables([updates, inserts]))
            txn = AppTransaction("merge", rep)
            return timed(lambda: engine.merge(self.master, data, ["c_custkey"], txn=txn))
        if operation == "snapshot":
            # A version not seen before, as after every commit: nothing cached.
            tick = frame(self.spark, output_batch(1, rep, 200 + rep), 1)
            engine.append(self.output, tick, AppTransaction("tick", rep))
            return timed(lambda: engine.snapshot(self.output))
        if operation == "read all":
            return timed(lambda: consume(engine.read(self.master)))
        if operation == "read 1/k":

            def read_part() -> None:
                snapshot = engine.snapshot(self.master)
                files = sorted(snapshot.files, key=lambda f: f.path)
                consume(engine.read_files(snapshot, files[rep % K :: K] or files[:1]))

            return timed(read_part)
        if operation == "rows added":
            latest = engine.snapshot(self.output).version
            return timed(lambda: consume(engine.rows_added(self.output, self.audited, latest)))
        raise ValueError(f"unknown operation {operation!r}")


def bench_operations(
    spark: SparkSession, root: Path, sizes: Sequence[Size], reps: int
) -> list[dict[str, Any]]:
    results = []
    for size in sizes:
        cases = {
            name: EngineCase(spark, open_engine(spark, name), root / size.name / name, size)
            for name in ENGINES
        }
        for operation in OPERATIONS:
            seconds: dict[str, list[float]] = {name: [] for name in ENGINES}
            for rep in range(reps):
                order = ENGINES if rep % 2 == 0 else tuple(reversed(ENGINES))
                for name in order:
                    seconds[name].append(cases[name].run(operation, rep))
            row: dict[str, Any] = {"size": size.name, "operation": operation}
            row.update({name: statistics.median(seconds[name]) for name in ENGINES})
            logger.info("%s %s: %s", size.name, operation, row)
            results.append(row)
    return results


def bench_pipeline(root: Path, intervals: int, scale: float) -> list[dict[str, Any]]:
    """The demo pipeline per interval on each engine: seconds of run + validate."""
    from demo.data import deliver
    from jobs.enrich import main as enrich
    from pipeline.config import load_config

    setups = {}
    cwd = Path.cwd()
    for name in ENGINES:
        folder = root / "pipeline" / name
        folder.mkdir(parents=True)
        raw = yaml.safe_load((REPO_ROOT / "configs" / "demo.yaml").read_text())
        raw["warehouse"]["engine"] = name
        raw["warehouse"]["root"] = str(folder / "warehouse")
        for stream in raw["streams"].values():
            stream["landing"] = str(folder / "landing" / Path(stream["landing"]).name)
        raw["expectations_dir"] = str(REPO_ROOT / "expectations")
        config_path = folder / "demo.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        base = ["--config", str(config_path)]
        demo = ["demo-data", "--scale", str(scale), "--intervals", str(intervals)]
        if enrich([*base, *demo, "--start", START.isoformat()]) != 0:
            raise RuntimeError(f"demo-data failed on the {name} engine")
        setups[name] = (base, load_config(config_path))
    results = []
    try:
        for index in range(intervals):
            row: dict[str, Any] = {"size": f"demo SF{scale:g}", "operation": f"interval {index}"}
            order = ENGINES if index % 2 == 0 else tuple(reversed(ENGINES))
            for name in order:
                base, config = setups[name]
                os.chdir(Path(config.warehouse.root).parent)
                outbox = Path(config.warehouse.root).parent / "outbox"
                streams = json.loads((outbox / "manifest.json").read_text())["streams"]
                for stream in streams:
                    deliver(outbox, stream, index, Path(config.streams[stream].landing))

                def interval(base: list[str] = base, index: int = index) -> None:
                    for command in ("run", "validate"):
                        if enrich([*base, command, "--run-id", f"i{index}"]) != 0:
                            raise RuntimeError(f"enrich {command} failed")

                row[name] = timed(interval)
            logger.info("pipeline %s", row)
            results.append(row)
    finally:
        os.chdir(cwd)
    return results


def render(rows: Sequence[dict[str, Any]], title: str) -> str:
    lines = [
        title,
        "",
        "| size | operation | embedded (s) | native (s) | native / embedded |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row["native"] / row["embedded"] if row["embedded"] else float("nan")
        lines.append(
            f"| {row['size']} | {row['operation']} | {row['embedded']:.2f} | "
            f"{row['native']:.2f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["demo", "sf1"])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--intervals", type=int, default=2)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument(
        "--out", type=Path, default=REPO_ROOT / "benchmarks/results/delta_engines.md"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "warehouse", "pipeline", "quality", "great_expectations", "jobs"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = build_session(
        SparkSettings(app_name="delta-engines-bench", conf={"spark.sql.shuffle.partitions": "4"})
    )
    if not has_delta_jars(spark):
        print("error: no delta-spark jars on the classpath; run `make jars`", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="delta-engines-") as tmp:
        operations = bench_operations(spark, Path(tmp), [SIZES[s] for s in args.sizes], args.reps)
        pipeline = bench_pipeline(Path(tmp), args.intervals, args.scale) if args.intervals else []
    header = (
        f"Embedded vs native Delta engine, local[2], median of {args.reps} repetitions, "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d}; ran {time.monotonic() - started:.0f}s"
    )
    text = "\n\n".join(
        [
            header,
            render(operations, "Engine operations"),
            render(pipeline, "Demo pipeline, one interval: enrich run + enrich validate"),
        ]
    )
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
