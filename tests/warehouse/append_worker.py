"""A writer process for crash and concurrency tests: appends id ranges to a Delta table.

Usage: python -m tests.warehouse.append_worker TABLE APP_ID FIRST_ID ROWS BATCHES
       [--engine embedded|native] [--label LABEL] [--barrier DIR:PARTIES] [--hold FILE]

Each batch is committed with app transaction (APP_ID, batch number) by the chosen Delta
engine (embedded by default); its rows are (id, LABEL), LABEL defaulting to APP_ID. With
``--barrier``, the commit guard of every batch waits until PARTIES workers have reached
their commit, so racing commits are made from the same table version. With ``--hold``, the
first batch stops in the middle of writing its data files: the first of its two partitions
is written, then the second one's task creates FILE and sleeps until the process is killed.
Each batch's outcome is printed to stdout as one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from tests.helpers import TEST_SPARK_CONF
from warehouse.delta import AppTransaction, open_engine
from warehouse.object_store import ObjectStore, is_object_store
from warehouse.spark import SparkSettings, build_session

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("writer", T.StringType())])
BARRIER_TIMEOUT_SECONDS = 240.0


def barrier_guard(spec: str, label: str) -> Callable[[], None]:
    """A commit guard that returns once ``PARTIES`` workers have called it (per batch)."""
    directory, _, parties = spec.rpartition(":")
    calls = 0

    def wait() -> None:
        nonlocal calls
        arrived = Path(directory) / f"{calls}"
        arrived.mkdir(parents=True, exist_ok=True)
        (arrived / label).touch()
        calls += 1
        deadline = time.monotonic() + BARRIER_TIMEOUT_SECONDS
        while len(list(arrived.iterdir())) < int(parties):
            if time.monotonic() > deadline:
                raise TimeoutError(f"barrier {arrived}: fewer than {parties} workers arrived")
            time.sleep(0.05)

    return wait


def held_mid_write(data: DataFrame, marker: str) -> DataFrame:
    """``data`` in two partitions, the second of which never finishes: its task creates
    ``marker`` and sleeps, after the first partition's file is written (one core)."""

    def hold(value, partition):  # type: ignore[no-untyped-def]  # no hints: a plain UDF
        if partition == 1:
            import time
            from pathlib import Path

            Path(marker).touch()
            time.sleep(3600)
        return value

    gate = F.udf(hold, T.StringType())
    return data.withColumn("writer", gate(F.col("writer"), F.spark_partition_id()))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("app_id")
    parser.add_argument("first_id", type=int)
    parser.add_argument("rows", type=int)
    parser.add_argument("batches", type=int)
    parser.add_argument("--engine", choices=["embedded", "native"], default="embedded")
    parser.add_argument("--label")
    parser.add_argument("--barrier")
    parser.add_argument("--hold")
    args = parser.parse_args(argv)
    label = args.label or args.app_id
    # A table in an object store: the store the environment names (warehouse.object_store).
    store = ObjectStore.from_environment() if is_object_store(args.table) else None
    spark = build_session(
        SparkSettings(app_name=label, master="local[1]", conf=TEST_SPARK_CONF, object_store=store)
    )
    engine = open_engine(spark, args.engine)
    if args.barrier:
        engine.commit_guard = barrier_guard(args.barrier, label)
    for batch in range(args.batches):
        start = args.first_id + batch * args.rows
        data = spark.createDataFrame([(i, label) for i in range(start, start + args.rows)], SCHEMA)
        data = data.repartition(2)
        if args.hold and batch == 0:
            data = held_mid_write(data, args.hold)
        outcome = engine.append(args.table, data, AppTransaction(args.app_id, batch))
        print(json.dumps(dataclasses.asdict(outcome)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
