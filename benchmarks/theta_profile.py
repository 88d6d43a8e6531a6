"""Where A-DSP's time goes, phase by phase, next to range binning on the same data.

    python -m benchmarks.theta_profile [--zipf 0] [--eps 1] [--rows 1000000] [--repeat 2]

TPC-H SF1 orders keyed by o_totalprice, master and stream of ``--rows`` each, band
predicate. Each phase is timed as its own Spark action: statistics (a counting job and a
sampling job, both sides at once), planning, the whole A-DSP join, routing alone, binning,
and A-DSP routing with the same JVM local join built by hand (an equi-join on task and
bin). The first repetition includes the JVM's warm-up.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.frames import stored_frame
from demo.data import ZipfSampler, generate_tpch
from joins import baseline
from joins.theta.adsp.join import adsp_join, numeric, route
from joins.theta.adsp.plan import plan_theta
from joins.theta.predicate import ThetaPredicate
from joins.theta.stats import master_statistics_of, stream_histogram_of, theta_samples
from warehouse.spark import SparkSettings, build_session


def timed(label: str, action: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    result = action()
    sys.stdout.write(f"{label}: {time.perf_counter() - started:.2f} s\n")
    sys.stdout.flush()
    return result


def profile_once(
    spark: SparkSession,
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    memory: float,
) -> None:
    lower, upper = predicate.band_bounds()
    width = max(lower + upper, 1e-9)
    s_sample, r_sample = timed(
        "statistics (both sides)", lambda: theta_samples(stream, master, predicate)
    )
    plan = timed(
        "plan",
        lambda: plan_theta(
            (stats := master_statistics_of(r_sample, predicate, 24, 32)).histogram,
            stream_histogram_of(s_sample, 16, 32),
            stats.ranges,
            memory,
            "adsp",
        ),
    )
    timed("A-DSP join + count", lambda: adsp_join(stream, master, predicate, plan).count())
    s_key = numeric(F.col("x"), stream.schema["x"].dataType)
    r_key = numeric(F.col("y"), master.schema["y"].dataType)
    routed_s = route(stream, s_key, plan.stream, plan, "stream", 64)
    routed_r = route(master, r_key, plan.master, plan, "master", 64)
    timed("routing alone (both sides, count)", lambda: (routed_s.count(), routed_r.count()))
    timed(
        "range binning + count",
        lambda: (
            baseline.binned_band_join_flagged(stream, master, predicate, "m", 0)
            .where("_matched")
            .count()
        ),
    )
    binned_r = routed_r.withColumn(
        "_bin",
        F.explode(
            F.sequence(
                F.floor((F.col("y") - upper) / width).cast("long"),
                F.floor((F.col("y") + lower) / width).cast("long"),
            )
        ),
    )
    binned_s = routed_s.withColumn("_bin", F.floor(F.col("x") / width).cast("long"))
    jvm = binned_s.join(
        binned_r,
        (binned_s["_task"] == binned_r["_task"])
        & (binned_s["_bin"] == binned_r["_bin"])
        & (binned_r["y"] >= binned_s["x"] - lower)
        & (binned_r["y"] <= binned_s["x"] + upper),
    )
    timed("A-DSP routing + JVM local join + count", jvm.count)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zipf", type=float, default=0.0)
    parser.add_argument("--eps", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    spark = build_session(
        SparkSettings(app_name="theta-profile", conf={"spark.sql.shuffle.partitions": "8"})
    )
    tpch = generate_tpch(1.0, Path("var/bench"))
    orders = pq.read_table(tpch / "orders.parquet", columns=["o_totalprice"])
    price = np.asarray(orders.column("o_totalprice").cast(pa.float64()).to_numpy())
    n = min(args.rows, len(price))
    rng = np.random.default_rng(5)

    def stored(table: pa.Table) -> DataFrame:
        return stored_frame(
            spark, table, Path("var/bench/frames"), spark.sparkContext.defaultParallelism
        )

    r_index = rng.choice(len(price), size=n, replace=False)
    master = stored(pa.table({"rid": np.arange(n), "y": price[r_index]})).cache()
    xs = (
        ZipfSampler(price[r_index], args.zipf, rng).draw(n)
        if args.zipf > 0
        else rng.choice(price[r_index], size=n)
    )
    stream = stored(pa.table({"sid": np.arange(n), "x": xs})).cache()
    stream.count(), master.count()
    predicate = ThetaPredicate(type="band", stream_column="x", master_column="y", eps=args.eps)
    memory = (n * 16 + n * 24) / 8
    for repetition in range(args.repeat):
        sys.stdout.write(f"-- repetition {repetition + 1}\n")
        profile_once(spark, stream, master, predicate, memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
