"""Hot keys in the SSBJ operator's key buckets: hash placement against FastJoin's migration.

    python -m benchmarks.skew_keys [--zipf 1 1.5 2] [--batch 50000] [--buckets 64]
                                   [--steps 8] [--partitions 2] [--threshold 1.2]

The stream joins TPC-H customer (SF1, 150k keys, one row each) on ``o_custkey`` with
Zipf-skewed keys (one fixed ranking: the same keys stay hot in every batch). Per z, the same
bronze commits run through one stage per method, side by side in one process:

- ``hash``: SSBJ with every key in bucket ``xxhash64(key) mod B`` (``rebalance: off``);
- ``greedyfit`` / ``safit``: SSBJ whose monitor moves whole keys between buckets after each
  step when the buckets' load imbalance LI exceeds ``--threshold`` (FastJoin Algorithms 1
  and 3);
- ``split``: GreedyFit, and a key with more than twice a mean bucket's tuples split over
  several buckets (``operator.split_hot_keys: 2``, the default);
- ``twochoice``: ``split`` with each hot key on at most two buckets, its own and the least
  loaded other (``operator.split_ways: 2``, STA's Algorithm 2 for hot keys);
- ``sketch``: ``split`` with ``operator.key_counts: sketch``: only the join values in the
  filter of the ASketch the buckets build and the driver merges get counters and can
  enter the cache (the others are counted nowhere);
- ``aqe``: a plain Spark join of each batch to the whole master, broadcast off, with Spark's
  adaptive skew-join handling on (it splits a skewed partition of the sort-merge join).

B key buckets are B Spark tasks one to one (``joins.skew.key_routing``), and adaptive partition
coalescing is off, so the bucket stage's task durations are the buckets' costs. Per method
the table gives, over the steps after the first R-cycle (warm-up, and the monitor's first
moves; with k = 2 the cache fills at step 4, so the hot keys are cached in most
measured steps): LI of FastJoin's load model (Eq. 2 over |R_i| * phi_si, ``inf`` when a bucket holds
nothing), the measured task LI of the bucket stage (slowest task / mean task), the step's
wall time, the makespan of the bucket stage simulated on P = 16, 64 and 256 executors by
list scheduling of its measured task durations (``benchmarks.makespan``), and the keys and
stored rows moved per trigger, the state's rows after a step (waiting tuples H_S, cache
rows H_R, value counters) and the share of tuples the cache answered. ``aqe``'s columns are of its join stage (the stage of the step with the largest
summed task time). ``--methods`` runs some of the methods (``hash`` always runs: the
ratios are to it).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from benchmarks.makespan import stage_makespan
from benchmarks.skew_sim import TaskMetrics
from benchmarks.ssbj_bench import MASTERS, Case, build_config, stream_batch
from benchmarks.standalone import free_port
from demo.data import ZipfSampler, _plain, generate_tpch
from pipeline.schemas import bronze_schema
from warehouse.delta import AppTransaction
from warehouse.delta.schema import arrow_to_spark
from warehouse.spark import SparkSettings, build_session

logger = logging.getLogger("skew-keys")
METHODS = ("hash", "greedyfit", "safit", "split", "twochoice", "sketch", "aqe")
EXECUTORS = (16, 64, 256)


def config(
    root: Path, partitions: int, threshold: float, methods: Sequence[str] = METHODS
) -> dict[str, Any]:
    """One stage per method over customer (``benchmarks.ssbj_bench.build_config``)."""
    split = {"mode": "ssbj", "rebalance": "greedyfit", "split_hot_keys": 2.0}
    operators: dict[str, dict[str, Any]] = {
        "hash": {"mode": "ssbj", "rebalance": "off"},
        "greedyfit": {"mode": "ssbj", "rebalance": "greedyfit", "split_hot_keys": None},
        "safit": {"mode": "ssbj", "rebalance": "safit", "split_hot_keys": None},
        "split": split,
        "twochoice": {**split, "split_ways": 2},
        "sketch": {**split, "key_counts": "sketch"},
        "aqe": {"mode": "baseline"},
    }
    return build_config(
        root,
        "customer",
        partitions,
        {m: {**operators[m], "rebalance_threshold": threshold} for m in methods},
        name="skew_keys",
    )


def bucket_stage(stages: list[list[float]], buckets: int, method: str) -> list[float]:
    """The task durations of the step's join stage: for SSBJ the stage of B tasks with the
    largest summed time (the Python bucket pass; the writes read its persisted result in
    lighter B-task stages), for the plain join the heaviest stage of any width."""
    candidates = [s for s in stages if method == "aqe" or len(s) == buckets]
    if not candidates:
        raise RuntimeError(f"{method}: no stage of {buckets} tasks in {[len(s) for s in stages]}")
    return max(candidates, key=sum)


def run_case(spark, tpch: Path, z: float, args: argparse.Namespace) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    spec = MASTERS["customer"]
    root = Path(tempfile.mkdtemp(prefix=f"skew-keys-z{z}-"))
    methods = args.methods
    case = Case.open(spark, config(root, args.partitions, args.threshold, methods))
    table = _plain(pq.read_table(tpch / spec.file)).select(spec.columns)
    case.load_master(spark.createDataFrame(table, arrow_to_spark(table.schema)).repartition(8))
    rng = np.random.default_rng(42)
    sampler = ZipfSampler(np.unique(table.column(spec.key).to_numpy()), z, rng)
    bronze = case.create_bronze()
    stream_schema = bronze_schema(case.config.streams["s"])
    metrics = TaskMetrics(spark)
    measured: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    warmup = args.partitions
    for step in range(args.steps):
        batch = stream_batch(
            spec, step * args.batch, sampler.draw(args.batch), np.zeros(args.batch), step
        )
        case.engine.append(
            bronze, spark.createDataFrame(batch, stream_schema), AppTransaction("bench", step)
        )
        for method in methods:
            group = f"skew-keys-{z}-{method}-{step}"
            spark.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            case.runner.run_stage_step(case.config.stage(method), f"s{step}")
            seconds = time.perf_counter() - started
            if step < warmup:
                continue
            tasks = bucket_stage(metrics.stages(group), args.buckets, method)
            measured[method].append({"seconds": seconds, "tasks": tasks})
        logger.info("z=%s step %d/%d done", z, step + 1, args.steps)
    spark.sparkContext.setJobGroup("", "")
    recorded = case.metrics()
    rows = []
    for method in methods:
        steps = measured[method]
        model = [values for s, values in sorted(recorded.get(method, {}).items()) if s > warmup]
        lis = [v.get("load_imbalance", math.nan) for v in model]
        triggers = [v for v in model if v.get("moved_keys", 0) > 0]
        rows.append(
            {
                "z": z,
                "method": method,
                "li_model": statistics.mean(math.inf if li < 0 else li for li in lis)
                if lis
                else math.nan,
                "li_tasks": statistics.mean(
                    max(s["tasks"]) / statistics.mean(s["tasks"]) for s in steps
                ),
                "seconds": statistics.mean(s["seconds"] for s in steps),
                "makespan": {
                    p: statistics.mean(stage_makespan(s["tasks"], p) for s in steps)
                    for p in EXECUTORS
                },
                "moved_keys": statistics.mean(v["moved_keys"] for v in triggers) if triggers else 0,
                "moved_tuples": statistics.mean(v["moved_tuples"] for v in triggers)
                if triggers
                else 0,
                "triggers": len(triggers),
                "steps": len(steps),
                **{
                    name: statistics.mean(v.get(name, 0) for v in model) if model else 0
                    for name in ("counter_rows", "pending_rows", "cache_rows")
                },
                "hit_share": sum(v.get("cache_hits", 0) for v in model)
                / max(1, sum(v.get("tuples_in", 0) for v in model)),
            }
        )
    case.store.dispose()
    return rows


def render(rows: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"customer SF1 (150k keys), w = {args.batch:,} tuples/step, k = {args.partitions}, "
        f"B = {args.buckets} buckets, Theta = {args.threshold}; means over steps "
        f"{args.partitions + 1}-{args.steps}; local[2] on 2 cores",
        "",
        "| z | method | LI (model, Eq. 2) | LI (tasks, max/mean) | step s | "
        + " | ".join(f"makespan P={p} s" for p in EXECUTORS)
        + " | vs hash at P=64 | triggers | keys moved/trigger | stored rows moved/trigger"
        + " | state rows: H_S / H_R / counters | cache answered |",
        "|---|---|---|---|---|" + "---|" * len(EXECUTORS) + "---|---|---|---|---|---|",
    ]
    for z in sorted({r["z"] for r in rows}):
        base = next(r for r in rows if r["z"] == z and r["method"] == "hash")["makespan"][64]
        for r in (r for r in rows if r["z"] == z):
            li = "-" if r["method"] == "aqe" else f"{r['li_model']:.2f}"
            state = (
                "- | -"
                if r["method"] == "aqe"
                else f"{r['pending_rows']:,.0f} / {r['cache_rows']:,.0f} / "
                f"{r['counter_rows']:,.0f} | {100 * r['hit_share']:.1f}%"
            )
            lines.append(
                f"| {z:g} | {r['method']} | {li} | {r['li_tasks']:.2f} | {r['seconds']:.2f} | "
                + " | ".join(f"{r['makespan'][p]:.3f}" for p in EXECUTORS)
                + f" | {base / r['makespan'][64]:.2f}x | {r['triggers']}/{r['steps']} | "
                f"{r['moved_keys']:.1f} | {r['moved_tuples']:.0f} | {state} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zipf", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--buckets", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=1.2)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/skew-keys.md"))
    parser.add_argument("--case-json", type=Path, help=argparse.SUPPRESS)  # one z, in a child
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.steps <= args.partitions:
        parser.error(f"--steps must exceed --partitions (the warm-up), got {args.steps}")
    args.methods = ["hash", *(m for m in METHODS if m in args.methods and m != "hash")]
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("warehouse", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if args.case_json is None:
        # One child process (one Spark) per z: a long run of grouped Arrow steps in one JVM
        # ran out of Arrow memory at the third z, and a fresh JVM per case keeps the cases
        # independent of each other's history.
        rows: list[dict[str, Any]] = []
        for z in args.zipf:
            case = Path(tempfile.mkdtemp(prefix="skew-keys-case-")) / "rows.json"
            own = list(sys.argv[1:] if argv is None else argv)
            command = [sys.executable, "-m", "benchmarks.skew_keys", *own]
            command += ["--zipf", str(z), "--case-json", str(case)]
            subprocess.run(command, check=True)
            for row in json.loads(case.read_text()):
                row["makespan"] = {int(p): v for p, v in row["makespan"].items()}
                rows.append(row)
        table = render(rows, args)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
        print(table)
        return 0
    spark = build_session(
        SparkSettings(
            app_name="skew-keys",
            conf={
                "spark.ui.enabled": "true",
                "spark.ui.port": str(free_port()),
                "spark.sql.shuffle.partitions": str(args.buckets),
                "spark.sql.adaptive.coalescePartitions.enabled": "false",
                "spark.sql.autoBroadcastJoinThreshold": "-1",
                "spark.sql.adaptive.skewJoin.enabled": "true",
            },
        )
    )
    tpch = generate_tpch(1.0, Path("var/bench"))
    rows = [row for z in args.zipf for row in run_case(spark, tpch, z, args)]
    args.case_json.write_text(json.dumps(rows))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
