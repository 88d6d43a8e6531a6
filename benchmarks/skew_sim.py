"""Skew at scale, by simulation: makespan of measured Spark tasks on P executors.

    python -m benchmarks.skew_sim [--rows 1000000] [--executors 2 16 64 256] [--sink count]
        [--cases "band eps=1"]

On two cores a hot task just runs on one of them, so skew cannot show in wall time. This
benchmark runs each theta join here, reads every task's duration from Spark's REST API
(the UI runs on a free loopback port), and replays the tasks on P simulated executors by
list scheduling (:mod:`benchmarks.makespan`). Each stage waits for the one before it.

Setup, the same for every method: inputs in 128 partitions, 128 shuffle partitions, and
AQE partition coalescing off, so a task is one hash partition: binning's tasks hold sets of
bins, A-DSP's (and Square's and Dynamic's) sets of (plan task, bin) pairs, since a band's
local join is an equi-join on both (``joins.theta.adsp.join.binned_local_join``). A-DSP, Square and Dynamic are planned with the per-task memory
V = input bytes / ``--memory-divisor`` (16: A-DSP then plans tens of tasks; a task holds
both an R and an S share, so the count is not the divisor) from the key statistics (a
counting job and a sampling job, both sides at once), which are counted too.

Each join's output is written to Parquet (``--sink parquet``, the default), as the pipeline
writes every enriched row; ``--sink count`` only counts it, which lets Spark skip building
the pairs and hides what a hot bin costs the task that forms them.

The table also gives, for the stage with the most task time (the join), its slowest task
over its mean task, and its largest task input (records read from files, the cache or a
shuffle) over the mean: whether a hot value overloads the task that receives it.

Cases: TPC-H orders by o_totalprice, band eps = 1 at z in {0, 1, 2} (Zipf over one fixed
ranking of R's values), and the wide band eps = 1000 at z = 0 and 2 on a smaller stream
(its output grows with eps).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.frames import stored_frame
from benchmarks.makespan import job_makespan
from benchmarks.standalone import free_port, standalone_cluster
from demo.data import ZipfSampler, generate_tpch
from joins import baseline
from joins.theta.adsp.join import RoutedSides, join_routed, key_spec, numeric, route
from joins.theta.predicate import ThetaPredicate
from joins.theta.stats import plan_from_samples, theta_samples
from warehouse.spark import SparkSettings, build_session

logger = logging.getLogger("skew-sim")
METHODS = ("adsp", "square", "dynamic", "binning")
PARTITIONS = 128


class TaskMetrics:
    """Durations of the finished tasks of a job group, per stage, from the REST API."""

    def __init__(self, spark: SparkSession) -> None:
        url = spark.sparkContext.uiWebUrl
        if not url:
            raise RuntimeError("the Spark UI is off; the benchmark needs its REST API")
        self.base = f"{url}/api/v1/applications/{spark.sparkContext.applicationId}"

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.base + path, timeout=30) as answer:
            return json.load(answer)

    def stages(self, group: str) -> list[list[float]]:
        """Task durations (s) of every stage the group ran, in stage order."""
        return [[seconds for seconds, _ in stage] for stage in self.stage_tasks(group)]

    def stage_tasks(self, group: str) -> list[list[tuple[float, int]]]:
        """(duration s, input rows) of each finished task of every stage the group ran, in
        stage order; input rows are the records the task read from files, the cache or a
        shuffle."""
        for _ in range(50):  # the listener records events asynchronously
            jobs = [j for j in self._get("/jobs") if j.get("jobGroup") == group]
            if jobs and all(j["status"] in ("SUCCEEDED", "FAILED") for j in jobs):
                break
            time.sleep(0.2)
        stage_ids = sorted({s for j in jobs for s in j["stageIds"]})
        out = []
        for stage_id in stage_ids:
            for attempt in self._get(f"/stages/{stage_id}"):
                if attempt["status"] != "COMPLETE":
                    continue  # skipped: its shuffle output was reused
                tasks = self._get(
                    f"/stages/{stage_id}/{attempt['attemptId']}/taskList?length=100000"
                )
                # In task-index order: the order the scheduler hands tasks out.
                ordered = sorted(tasks, key=lambda t: t["index"])
                out.append(
                    [
                        (t["duration"] / 1000, _records_read(t))
                        for t in ordered
                        if t["status"] == "SUCCESS"
                    ]
                )
        return out


def _records_read(task: dict[str, Any]) -> int:
    metrics = task.get("taskMetrics") or {}
    read = (metrics.get("inputMetrics") or {}).get("recordsRead", 0)
    return int(read) + int((metrics.get("shuffleReadMetrics") or {}).get("recordsRead", 0))


def run(
    spark: SparkSession,
    metrics: TaskMetrics,
    method: str,
    case: Mapping[str, Any],
    sink: Path | None = None,
) -> dict[str, Any]:
    """One join of a case of :func:`cases`, its output counted (``sink`` None) or written
    to Parquet at ``sink``; the read-back count after a write runs outside the job group, so
    it is not simulated."""
    stream, master = case["stream"], case["master"]
    predicate, memory = case["predicate"], case["memory"]
    group = f"sim-{method}-{time.monotonic_ns()}"
    spark.sparkContext.setJobGroup(group, method)
    started = time.perf_counter()
    tasks = "-"
    if method == "binning":
        joined = baseline.binned_band_join_flagged(stream, master, predicate, "m", 0).where(
            "_matched"
        )
    else:
        samples = theta_samples(stream, master, predicate)
        plan = plan_from_samples(*samples, predicate, memory, method, 16, 24)
        tasks = str(plan.tasks)
        keys = key_spec(predicate)
        s_key = numeric(F.col(keys.stream_key), stream.schema[keys.stream_key].dataType)
        r_key = numeric(F.col(keys.master_key), master.schema[keys.master_key].dataType)
        routed_s = route(stream, s_key, plan.stream, plan, "stream", 64)
        routed_r = route(master, r_key, plan.master, plan, "master", 64)
        sides = RoutedSides(routed_s, routed_r, stream.schema, master.schema)
        joined = join_routed(sides, predicate)
    if sink is None:
        rows = joined.count()
    else:
        # The pipeline writes every enriched row: a hot bin's pairs are serialised and
        # written by the one task that forms them. A count lets Spark skip building them.
        joined.write.mode("overwrite").parquet(str(sink))
        spark.sparkContext.setJobGroup(f"{group}-readback", method)
        rows = spark.read.parquet(str(sink)).count()
    seconds = time.perf_counter() - started
    tasks_of = metrics.stage_tasks(group)
    stages = [[seconds for seconds, _ in stage] for stage in tasks_of]
    # The join stage: the one that takes the most task time (both routed sides meet there).
    heaviest_tasks = max(tasks_of, key=lambda stage: sum(t for t, _ in stage), default=[])
    heaviest = [seconds for seconds, _ in heaviest_tasks]
    rows_in = [rows for _, rows in heaviest_tasks]
    return {
        "method": method,
        "tasks": tasks,
        "rows": rows,
        "seconds": seconds,
        "stages": stages,
        "task_li": max(heaviest) / (sum(heaviest) / len(heaviest)) if sum(heaviest) else 0.0,
        "rows_li": max(rows_in) / (sum(rows_in) / len(rows_in)) if sum(rows_in) else 0.0,
    }


def cases(spark: SparkSession, args: argparse.Namespace) -> list[dict[str, Any]]:
    tpch = generate_tpch(1.0, Path("var/bench"))
    price = np.asarray(
        pq.read_table(tpch / "orders.parquet", columns=["o_totalprice"])
        .column("o_totalprice")
        .cast(pa.float64())
        .to_numpy()
    )
    rng = np.random.default_rng(5)
    built = []
    for label, eps, s_rows, zs in (
        ("band eps=1", 1.0, args.rows, args.zipf),
        ("wide band eps=1000", 1000.0, args.rows // 50, [0.0, 2.0]),
    ):
        if args.cases and label not in args.cases:
            continue
        r_rows = min(args.rows, len(price))
        r_index = rng.choice(len(price), size=r_rows, replace=False)
        master = frame(spark, {"rid": np.arange(r_rows), "y": price[r_index]})
        for z in zs:
            sampler = ZipfSampler(price[r_index], z, rng) if z > 0 else None
            xs = sampler.draw(s_rows) if sampler else rng.choice(price[r_index], size=s_rows)
            stream = frame(spark, {"sid": np.arange(s_rows), "x": xs})
            built.append(
                {
                    "name": f"{label} {s_rows // 1000}k x {r_rows // 1000}k z={z:g}",
                    "stream": stream,
                    "master": master,
                    "predicate": ThetaPredicate(
                        type="band", stream_column="x", master_column="y", eps=eps
                    ),
                    "memory": (s_rows * 16 + r_rows * 24) / args.memory_divisor,
                }
            )
    return built


def frame(spark: SparkSession, columns: dict[str, np.ndarray]) -> DataFrame:
    """Read from Parquet, spread over ``PARTITIONS`` partitions and cached."""
    stored = stored_frame(spark, pa.table(columns), Path("var/bench/frames"), 2)
    cached = stored.repartition(PARTITIONS).cache()
    cached.count()
    return cached


def render(results: Sequence[dict[str, Any]], executors: Sequence[int]) -> str:
    head = " | ".join(f"P={p} s" for p in executors)
    ratios = " | ".join(f"binning / this at P={p}" for p in executors[-2:])
    lines = [
        f"| case | method | tasks | output rows | wall s (2 cores) | {head} | "
        f"busiest task s | heaviest stage, task max/mean: seconds | input rows | {ratios} |",
        "|---|---|---|---|---|"
        + "---|" * len(executors)
        + "---|---|---|"
        + "---|" * len(executors[-2:]),
    ]
    by_case: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_case.setdefault(r["case"], []).append(r)
    for case, rows in by_case.items():
        binning = next((r for r in rows if r["method"] == "binning"), None)
        for r in rows:
            spans = [job_makespan(r["stages"], p) for p in executors]
            busiest = max((max(s) for s in r["stages"] if s), default=0.0)
            ratio = " | ".join("-" for _ in executors[-2:])
            if binning is not None:
                ratio = " | ".join(
                    f"{job_makespan(binning['stages'], p) / span:.2f}x"
                    for p, span in zip(executors[-2:], spans[-2:], strict=True)
                )
            cells = " | ".join(f"{s:.2f}" for s in spans)
            lines.append(
                f"| {case} | {r['method']} | {r['tasks']} | {r['rows']:,} | "
                f"{r['seconds']:.2f} | {cells} | {busiest:.2f} | {r['task_li']:.2f} | {r['rows_li']:.2f} | {ratio} |"
            )
    return "\n".join(lines)


def session(master: str | None = None) -> SparkSession:
    conf = {
        "spark.ui.enabled": "true",
        "spark.ui.port": str(free_port()),
        "spark.sql.shuffle.partitions": str(PARTITIONS),
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
    }
    if master is None:
        return build_session(SparkSettings(app_name="skew-sim", conf=conf))
    conf.update({"spark.executor.cores": "1", "spark.executor.memory": "2g"})
    return build_session(SparkSettings(app_name="skew-sim-cluster", master=master, conf=conf))


def validate(args: argparse.Namespace, local: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same joins on a real 2-worker standalone cluster (1 core each): its wall time
    against the makespan simulated at P = 2 from the local run's tasks and from its own."""
    rows = []
    with standalone_cluster(Path("var/skew-sim-cluster")) as url:
        spark = session(url)
        metrics = TaskMetrics(spark)
        try:
            for case in cases(spark, args):
                if case["name"] not in args.validate:
                    continue
                for method in args.methods:
                    measured = run(spark, metrics, method, case, args.sink_path)
                    here = next(
                        r for r in local if r["case"] == case["name"] and r["method"] == method
                    )
                    rows.append(
                        {
                            "case": case["name"],
                            "method": method,
                            "cluster_wall": measured["seconds"],
                            "simulated_local": job_makespan(here["stages"], 2),
                            "simulated_cluster": job_makespan(measured["stages"], 2),
                            "rows_equal": measured["rows"] == here["rows"],
                        }
                    )
                    logger.info("cluster %s", rows[-1])
        finally:
            spark.stop()
    return rows


def render_validation(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| case | method | cluster wall s | simulated P=2 from local tasks | ratio | "
        "simulated P=2 from the cluster's tasks | ratio | same output rows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['method']} | {r['cluster_wall']:.2f} | "
            f"{r['simulated_local']:.2f} | {r['cluster_wall'] / r['simulated_local']:.2f} | "
            f"{r['simulated_cluster']:.2f} | "
            f"{r['cluster_wall'] / r['simulated_cluster']:.2f} | {r['rows_equal']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="master and stream rows")
    parser.add_argument("--zipf", type=float, nargs="+", default=[0.0, 1.0, 2.0])
    parser.add_argument("--memory-divisor", type=float, default=16.0)
    parser.add_argument("--executors", type=int, nargs="+", default=[2, 16, 64, 256])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument(
        "--cases",
        nargs="+",
        default=[],
        choices=("band eps=1", "wide band eps=1000"),
        help="only these cases (default: both)",
    )
    parser.add_argument(
        "--validate",
        nargs="*",
        default=[],
        help="cases (e.g. 'band eps=1 1000k x 1000k z=2') to run again on a 2-worker "
        "standalone cluster on loopback",
    )
    parser.add_argument(
        "--sink",
        choices=("parquet", "count"),
        default="parquet",
        help="write the join's output to Parquet, as the pipeline writes it (default), or "
        "only count it",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/skew-sim.md"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    args.sink_path = Path("var/bench/skew-sim-output") if args.sink == "parquet" else None
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
    spark = session()
    metrics = TaskMetrics(spark)
    results = []
    for case in cases(spark, args):
        for method in args.methods:
            row = run(spark, metrics, method, case, args.sink_path)
            row["case"] = case["name"]
            for index, tasks in enumerate(row["stages"]):
                logger.info(
                    "  stage %d: %d tasks, sum %.2f s, max %.2f s",
                    index,
                    len(tasks),
                    sum(tasks),
                    max(tasks, default=0.0),
                )
            logger.info(
                "%s %s: %d rows, %.2f s, %d stages, makespan at P=64 %.2f s",
                case["name"],
                method,
                row["rows"],
                row["seconds"],
                len(row["stages"]),
                job_makespan(row["stages"], 64),
            )
            results.append(row)
    table = render(results, args.executors)
    if args.validate:
        spark.stop()
        table += "\n\nValidation on a standalone cluster (2 workers x 1 core, loopback)\n\n"
        table += render_validation(validate(args, results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
