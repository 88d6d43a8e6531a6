"""A writer process for crash and concurrency tests: appends id ranges to a Delta table.

Usage: python -m tests.warehouse.append_worker TABLE APP_ID FIRST_ID ROWS BATCHES
       [--label LABEL] [--barrier DIR:PARTIES]

Each batch is committed with app transaction (APP_ID, batch number); its rows are
(id, LABEL), LABEL defaulting to APP_ID. With ``--barrier``, the commit guard of every batch
waits until PARTIES workers have reached their commit, so racing commits are made from the
same table version. Each batch's outcome is printed to stdout as one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import types as T

from warehouse.delta import AppTransaction
from warehouse.delta.embedded import EmbeddedDeltaEngine
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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("table")
    parser.add_argument("app_id")
    parser.add_argument("first_id", type=int)
    parser.add_argument("rows", type=int)
    parser.add_argument("batches", type=int)
    parser.add_argument("--label")
    parser.add_argument("--barrier")
    args = parser.parse_args(argv)
    label = args.label or args.app_id
    spark = build_session(
        SparkSettings(app_name=label, master="local[1]", conf={"spark.sql.shuffle.partitions": "1"})
    )
    engine = EmbeddedDeltaEngine(spark)
    if args.barrier:
        engine.commit_guard = barrier_guard(args.barrier, label)
    for batch in range(args.batches):
        start = args.first_id + batch * args.rows
        data = spark.createDataFrame([(i, label) for i in range(start, start + args.rows)], SCHEMA)
        outcome = engine.append(args.table, data.repartition(2), AppTransaction(args.app_id, batch))
        print(json.dumps(dataclasses.asdict(outcome)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
