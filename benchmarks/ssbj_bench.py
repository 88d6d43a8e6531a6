"""SSBJ vs MESHJOIN vs a plain Spark join per batch, on TPC-H, in one process.

    python -m benchmarks.ssbj_bench [--scale 1] [--batch 20000] [--partitions 4]
                                    [--steps 20] [--zipf 0 0.5 1 1.5] [--masters customer partsupp]
    python -m benchmarks.ssbj_bench --experiment memory [--memory-share 0.3 0.5 1.0]
                                    [--memory-partitions 5] [--memory-warmup-cycles 5]
                                    [--backlog 150000] [--commit 1000]
                                    [--mesh-multiples 1 2 4 8]
    python -m benchmarks.ssbj_bench --experiment anatomy [--batch 20000] [--partitions 4]

``--experiment memory`` is the paper's Fig. 5 setting: both operators get the same memory
budget M (``operator.memory_bytes``, a share of the master's |R|·v_R bytes; each share given
is a case of its own), the stream is a
backlog in bronze (commits of ``--commit`` tuples), and each step admits what fits in M
(Eq. 1). The operator, not the arrival rate, bounds throughput, so the service rate ratio
SSBJ / MESHJOIN at equal memory is the paper's headline figure. Steps alternate between the
two operators over the same backlog; the first R-cycles (5, `--memory-warmup-cycles`) are
warm-up, and the next ones (3, ``--memory-measured-cycles``) are measured: one whole period
of SSBJ's incrementing, switching and phase-out cycles, whose steps cost differently (one
phase-out cycle alone, measured until session 34, flattered SSBJ by about a fifth). Five
warm-up cycles measure SSBJ's steady state: its cache is first filled at cycle 3's
phase-out from counts taken while H_S was still filling (65% of the tuples on SF1
customer at z = 1 and 0.5 x), and refilled at cycle 6's from a whole cycle of them (79%,
Theorem 1's least state caching 78-81%); two warm-up cycles, used until session 37,
measured the first cache. With
``--mesh-multiples``, MESHJOIN also runs at those multiples of M: the paper's second
headline, the state MESHJOIN needs for SSBJ's service rate, is interpolated between the two
multiples whose rates bracket SSBJ's (:func:`state_at_equal_rate`). Beside it, the least
state any SSBJ can hold at SSBJ's measured tuples per step (Theorem 1 with the stream's
exact probabilities, ``joins.ssbj.cache.least_state``) and MESHJOIN's state at the same
rate over it: while both operators' steps cost the same for the same tuples per step, that
is the most the state ratio at equal service rate can be at this M.

``--experiment anatomy`` counts, per step of each mode, the Spark jobs (a job group per
step, read from the status tracker) and the Delta commits (versions added to the output and
to every operator table), with new input and without (an idle step), and their wall time.

The default experiment (``rate``) gives every operator the same w per step:

For each master (customer: one-to-many on custkey; partsupp: many-to-many on partkey,
4 suppliers per part) and each Zipf skew z of the stream's join key, the same stream
batches run through three stages side by side:

- plain: Spark joins each batch with the whole master snapshot (stateless);
- meshjoin: SSBJ's disk phase only (cache off);
- ssbj_paper: cache phase + MESHJOIN, cache migrated by the cache inequality with
  s_count estimated as Algorithm 1 writes it;
- ssbj: the same with the extrapolated s_count estimator (values never counted while
  pending are not switched; partial counts are scaled to all k partitions).

The first 3 R-cycles are warm-up (SSBJ's cache fills at the first phase-out); the table
reports the steps after them: service rate (stream tuples per second of step time), master
bytes read per step, H_S and H_R sizes at the end, the share of tuples served by the cache,
and the state ratio MESHJOIN / SSBJ. The cost model (Eq. 2) is fitted on all measured SSBJ
steps and its c_loop prediction is printed next to the measured mean.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame

from demo.data import ZipfSampler, _plain, generate_tpch
from joins.ssbj.cache.cost_model import StepMeasurement, fit_step_costs, loop_seconds
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.least_state import StateBound, least_state
from joins.ssbj.cache.rcycle import CycleState, StepPosition
from pipeline.config import PipelineConfig, parse_config
from pipeline.handles import PipelineHandles
from pipeline.layout import WarehouseLayout
from pipeline.runner import PipelineRunner
from pipeline.schemas import bronze_schema
from warehouse.delta import AppTransaction
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.delta.schema import arrow_to_spark
from warehouse.spark import SparkSettings, build_session
from warehouse.state_store import StateStore

logger = logging.getLogger("bench")


@dataclass(frozen=True)
class MasterSpec:
    """A TPC-H table used as the master, and the stream column that joins it."""

    file: str
    key: str
    columns: list[str]
    stream_key: str

    @property
    def table(self) -> str:
        """The TPC-H table the file holds."""
        return self.file.removesuffix(".parquet")


MASTERS = {
    "customer": MasterSpec(
        file="customer.parquet",
        key="c_custkey",
        columns=["c_custkey", "c_name", "c_nationkey", "c_acctbal", "c_mktsegment"],
        stream_key="o_custkey",
    ),
    # Every column of customer (about 180 bytes a row, most of it strings): a join that
    # enriches with the whole row reads all of it, where SSBJ reads a 1/k slice.
    "customer_wide": MasterSpec(
        file="customer.parquet",
        key="c_custkey",
        columns=[
            "c_custkey",
            "c_name",
            "c_address",
            "c_nationkey",
            "c_phone",
            "c_acctbal",
            "c_mktsegment",
            "c_comment",
        ],
        stream_key="o_custkey",
    ),
    "partsupp": MasterSpec(
        file="partsupp.parquet",
        key="ps_partkey",
        columns=["ps_partkey", "ps_suppkey", "ps_availqty", "ps_supplycost"],
        stream_key="l_partkey",
    ),
}
MODES = ("plain", "meshjoin", "ssbj_paper", "ssbj")
OPERATORS = {
    "plain": {"mode": "baseline"},
    "meshjoin": {"mode": "meshjoin"},
    "ssbj_paper": {"mode": "ssbj", "scount_estimator": "paper"},
    "ssbj": {"mode": "ssbj", "scount_estimator": "extrapolated"},
}


def build_config(
    root: Path,
    master: str,
    partitions: int,
    operators: Mapping[str, Mapping[str, Any]] = OPERATORS,
    name: str = "bench",
    bound: str | None = None,
) -> dict:
    """A pipeline of one stream joined to ``master`` by one equi stage per entry of
    ``operators`` (stage name -> its ``operator`` settings), k = ``partitions`` each;
    ``bound``: every stage's ``freshness.complete_within`` (None: the default, 1 interval,
    so a stateful stage takes its whole R-cycle of k steps a run)."""
    spec = MASTERS[master]
    stages = []
    for mode, operator in operators.items():
        stages.append(
            {
                "name": f"{mode}",
                "kind": "equi",
                "input": "s",
                "master": "m",
                "join_on": {spec.stream_key: spec.key},
                "join": "inner",
                "output": f"out_{mode}",
                "operator": {**operator, "partitions": partitions},
                **({"freshness": {"complete_within": bound}} if bound else {}),
            }
        )
    return {
        "name": name,
        "warehouse": {"root": str(root / "wh"), "state_store": f"sqlite:///{root / 'state.db'}"},
        "streams": {
            "s": {
                "landing": str(root / "landing"),
                "format": "json",
                "event_time": "ts",
                "id_column": "sid",
                "columns": [
                    "sid bigint not null",
                    f"{spec.stream_key} bigint",
                    "payload double",
                    "ts timestamp not null",
                ],
            }
        },
        "masters": {"m": {"table": "masters/m", "keys": [spec.key], "columns": spec.columns}},
        "stages": stages,
    }


@dataclass
class Case:
    """One benchmark warehouse: its pipeline, engine, state store and paths."""

    config: PipelineConfig
    engine: EmbeddedDeltaEngine
    store: StateStore
    runner: PipelineRunner
    layout: WarehouseLayout

    @classmethod
    def open(cls, spark, config: dict) -> Case:  # type: ignore[no-untyped-def]
        parsed = parse_config(config)
        engine = EmbeddedDeltaEngine(spark)
        store = StateStore(parsed.warehouse.resolved_state_store())
        return cls(
            parsed,
            engine,
            store,
            PipelineRunner(PipelineHandles(parsed, spark, engine, store)),
            WarehouseLayout.of(parsed),
        )

    def load_master(self, frame: DataFrame) -> str:
        path = self.layout.master(self.config, "m")
        self.engine.create_table(path, frame.schema, (), {"delta.enableChangeDataFeed": "true"})
        self.engine.append(path, frame)
        return path

    def create_bronze(self) -> str:
        bronze = self.layout.bronze("s")
        self.engine.create_table(bronze, bronze_schema(self.config.streams["s"]))
        return bronze

    def metrics(self) -> dict[str, dict[int, dict[str, float]]]:
        """Recorded metrics by stage, step and name."""
        by_stage: dict[str, dict[int, dict[str, float]]] = {}
        for metric in self.store.metrics():
            by_stage.setdefault(metric.stage, {}).setdefault(metric.step, {})[metric.name] = (
                metric.value
            )
        return by_stage


def stream_batch(
    spec: MasterSpec, first_sid: int, keys: np.ndarray, payload: np.ndarray, batch_id: int
) -> pa.Table:
    """Bronze rows of one stream commit: ids from ``first_sid``, the sampled join keys."""
    n = len(keys)
    return pa.table(
        {
            "sid": pa.array(np.arange(first_sid, first_sid + n), pa.int64()),
            spec.stream_key: pa.array(keys, pa.int64()),
            "payload": pa.array(payload),
            "ts": pa.array([dt.datetime(2024, 1, 1)] * n, pa.timestamp("us", tz="UTC")),
            "_source_file": pa.array([f"bench-{batch_id}"] * n),
            "_batch_id": pa.array([batch_id] * n, pa.int64()),
        }
    )


def run_case(spark, tpch: Path, master: str, z: float, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    spec = MASTERS[master]
    root = Path(tempfile.mkdtemp(prefix=f"ssbj-{master}-z{z}-"))
    case = Case.open(spark, build_config(root, master, args.partitions))
    table = _plain(pq.read_table(tpch / spec.file)).select(spec.columns)
    frame = spark.createDataFrame(table, arrow_to_spark(table.schema))
    master_path = case.load_master(frame.repartition(4 * args.partitions))
    master_bytes = case.engine.snapshot(master_path).size_bytes
    keys = np.unique(table.column(spec.key).to_numpy())
    rng = np.random.default_rng(42)
    sampler = ZipfSampler(keys, z, rng)  # one ranking: the same keys stay hot in every batch
    bronze = case.create_bronze()
    stream_schema = bronze_schema(case.config.streams["s"])
    warmup = 3 * args.partitions
    timings: dict[str, list[float]] = {m: [] for m in MODES}
    for step in range(args.steps):
        sampled = sampler.draw(args.batch)
        batch = stream_batch(spec, step * args.batch, sampled, rng.random(args.batch), step)
        case.engine.append(
            bronze, spark.createDataFrame(batch, stream_schema), AppTransaction("bench", step)
        )
        for mode in MODES:
            started = time.perf_counter()
            case.runner.run_stage_step(case.config.stage(mode), f"step{step}")
            if step >= warmup:
                timings[mode].append(time.perf_counter() - started)
        logger.info("%s z=%s step %d/%d done", master, z, step + 1, args.steps)
    result = {"master": master, "z": z, "master_bytes": master_bytes, "root": str(root)}
    metrics = case.metrics()
    measured_steps = args.steps - warmup
    for mode in MODES:
        steps = [values for step, values in sorted(metrics[mode].items()) if step > warmup]
        tuples = sum(s.get("tuples_in", 0) for s in steps)
        result[mode] = {
            "rate": tuples / sum(timings[mode]),
            "bytes_read": statistics.mean(s.get("master_bytes_read", 0) for s in steps),
            "pending_rows": steps[-1].get("pending_rows", 0),
            "pending_bytes": steps[-1].get("pending_bytes", 0),
            "cache_rows": steps[-1].get("cache_rows", 0),
            "cache_bytes": steps[-1].get("cache_bytes", 0),
            "cache_share": sum(s.get("cache_hits", 0) for s in steps) / max(1, tuples),
            "seconds": statistics.mean(timings[mode]),
            "steps": measured_steps,
        }
    ssbj_steps = [v for _, v in sorted(metrics["ssbj"].items())]
    b = table.num_rows / args.partitions
    samples = [
        StepMeasurement(b, s.get("cache_hits", 0), s.get("entered_pending", 0), s["step_seconds"])
        for s in ssbj_steps
    ]
    # The first R-cycle carries JVM and cache warm-up; fit Eq. 2 on the steps after it and
    # predict the measured steps.
    try:
        costs = fit_step_costs(samples[args.partitions :])
        measured = samples[warmup:]
        predicted = [
            loop_seconds(m.partition_rows, m.cache_tuples, m.disk_tuples, costs) for m in measured
        ]
        result["cost_model"] = {
            "predicted": statistics.mean(predicted),
            "measured": statistics.mean(m.seconds for m in measured),
            "mape": statistics.mean(
                abs(p - m.seconds) / m.seconds for p, m in zip(predicted, measured, strict=True)
            ),
        }
    except ValueError:
        result["cost_model"] = None
    case.store.dispose()
    return result


def render(results: Sequence[dict], args: argparse.Namespace) -> str:
    lines = [
        f"TPC-H SF{args.scale:g}, batch w={args.batch} tuples/step, k={args.partitions}, "
        f"{args.steps} steps ({3 * args.partitions} warm-up), local[2] on 2 cores",
        "",
        "| master | z | mode | service rate (tuples/s) | master MB read/step | H_S rows | H_S MB | H_R rows | H_R MB | cache share |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for mode in MODES:
            m = r[mode]
            lines.append(
                f"| {r['master']} | {r['z']:g} | {mode} | {m['rate']:,.0f} | {m['bytes_read'] / 1e6:.2f} | "
                f"{m['pending_rows']:,.0f} | {m['pending_bytes'] / 1e6:.2f} | {m['cache_rows']:,.0f} | "
                f"{m['cache_bytes'] / 1e6:.2f} | {m['cache_share']:.0%} |"
            )
    lines += [
        "",
        "| master | z | state MESHJOIN/SSBJ (bytes) | MESHJOIN/SSBJ-paper (bytes) | state ratio (rows) | rate SSBJ/MESHJOIN | rate SSBJ/plain | read plain/SSBJ | c_loop predicted | c_loop measured | per-step error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        mesh, ssbj_, plain, paper = r["meshjoin"], r["ssbj"], r["plain"], r["ssbj_paper"]
        paper_state = paper["pending_bytes"] + paper["cache_bytes"]
        mesh_state = mesh["pending_bytes"] + mesh["cache_bytes"]
        ssbj_state = ssbj_["pending_bytes"] + ssbj_["cache_bytes"]
        mesh_rows = mesh["pending_rows"] + mesh["cache_rows"]
        ssbj_rows = ssbj_["pending_rows"] + ssbj_["cache_rows"]
        model = r.get("cost_model") or {
            "predicted": float("nan"),
            "measured": float("nan"),
            "mape": float("nan"),
        }
        lines.append(
            f"| {r['master']} | {r['z']:g} | {mesh_state / max(1, ssbj_state):.2f}x | "
            f"{mesh_state / max(1, paper_state):.2f}x | "
            f"{mesh_rows / max(1, ssbj_rows):.2f}x | {ssbj_['rate'] / mesh['rate']:.2f}x | "
            f"{ssbj_['rate'] / plain['rate']:.2f}x | {plain['bytes_read'] / max(1, ssbj_['bytes_read']):.2f}x | "
            f"{model['predicted']:.2f}s | {model['measured']:.2f}s | {model['mape']:.0%} |"
        )
    return "\n".join(lines)


def mesh_stage(multiple: float) -> str:
    """The stage name of MESHJOIN at ``multiple`` x the budget M (``meshjoin`` at 1); stage
    names are identifiers, so 1.5 gives ``meshjoin_x1p5``."""
    if not multiple > 0:
        raise ValueError(f"a memory multiple must be > 0, found {multiple}")
    if multiple == 1:
        return "meshjoin"
    text = f"{multiple:g}"
    if "e" in text:
        raise ValueError(f"a memory multiple must be written plainly, found {text}")
    return "meshjoin_x" + text.replace(".", "p")


def memory_config(
    root: Path, master: str, partitions: int, budget: int, mesh_multiples: Sequence[float] = (1,)
) -> tuple[dict, dict[str, float]]:
    """SSBJ at M = ``budget``; MESHJOIN at M and at each of ``mesh_multiples`` x M: the
    pipeline config, and each stage's multiple of M."""
    multiples = {"ssbj": 1.0} | {mesh_stage(m): float(m) for m in sorted({1.0, *mesh_multiples})}
    operators = {name: OPERATORS["ssbj" if name == "ssbj" else "meshjoin"] for name in multiples}
    config = build_config(root, master, partitions, operators)
    config["stages"] = [
        {
            **stage,
            "operator": {
                **stage["operator"],
                "memory_bytes": int(budget * multiples[stage["name"]]),
            },
        }
        for stage in config["stages"]
    ]
    return config, multiples


def run_memory_case(  # type: ignore[no-untyped-def]
    spark, tpch: Path, master: str, z: float, share: float, args: argparse.Namespace
) -> dict:
    """Equal memory M = ``share`` x |R|·v_R for MESHJOIN and SSBJ over one backlog; service
    rate and state. With ``--mesh-multiples``, MESHJOIN also runs at those multiples of M
    (equal service rate)."""
    from pipeline.row_bytes import measured_row_bytes

    spec = MASTERS[master]
    root = Path(tempfile.mkdtemp(prefix=f"ssbj-mem-{master}-z{z}-"))
    table = _plain(pq.read_table(tpch / spec.file)).select(spec.columns)
    schema = arrow_to_spark(table.schema)
    frame = spark.createDataFrame(table, schema)
    v_r = measured_row_bytes(frame) or 1.0
    budget = int(share * table.num_rows * v_r)
    k = args.memory_partitions
    config, multiples = memory_config(root, master, k, budget, args.mesh_multiples)
    modes = [stage["name"] for stage in config["stages"]]
    case = Case.open(spark, config)
    # One file, as delta-rs and many small writers lay a dimension out: the scan copy must
    # still give every step |R|/k rows.
    case.load_master(frame.coalesce(1))
    keys = np.unique(table.column(spec.key).to_numpy())
    rng = np.random.default_rng(42)
    sampler = ZipfSampler(keys, z, rng)
    bronze = case.create_bronze()
    arrow_schema = pa.schema(DeltaTable(bronze).schema().to_arrow())
    for number, start in enumerate(range(0, args.backlog, args.commit), start=1):
        n = min(args.commit, args.backlog - start)
        batch = stream_batch(spec, start, sampler.draw(n), rng.random(n), start)
        write_deltalake(bronze, batch.cast(arrow_schema), mode="append")
        if number % 100 == 0:  # as a Spark writer would (every 10): a step reads a short log
            DeltaTable(bronze).create_checkpoint()
    logger.info("memory %s z=%s: backlog of %d tuples written", master, z, args.backlog)
    warmup = args.memory_warmup_cycles * k
    steps = warmup + args.memory_measured_cycles * k
    warn_unless_whole_periods(args.memory_measured_cycles)
    timings: dict[str, list[float]] = {m: [] for m in modes}
    by_state: dict[str, dict[CycleState, list[float]]] = {m: {} for m in modes}
    for step in range(steps):
        for mode in modes:
            started = time.perf_counter()
            case.runner.run_stage_step(case.config.stage(mode), f"step{step}")
            if step >= warmup:
                timings[mode].append(time.perf_counter() - started)
                state = StepPosition(step, k).state
                by_state[mode].setdefault(state, []).append(timings[mode][-1])
        logger.info("memory %s z=%s step %d/%d done", master, z, step + 1, steps)
    metrics = case.metrics()
    result: dict = {
        "master": master,
        "z": z,
        "share": share,
        "budget": budget,
        "k": k,
        "rows": table.num_rows,
        "modes": modes,
        "multiples": multiples,
    }
    for mode in modes:
        measured = [v for step, v in sorted(metrics[mode].items()) if step > warmup]
        tuples = sum(s.get("tuples_in", 0) for s in measured)
        if not tuples:  # the backlog ran out before the measured steps: nothing measured
            logger.warning("memory %s: no input in the measured steps (raise --backlog)", mode)
            measured = measured or [{}]
        result[mode] = {
            "rate": tuples / sum(timings[mode]),
            "tuples_per_step": tuples / len(measured),
            "seconds": statistics.mean(timings[mode]),
            "state_max": max(s.get("state_bytes", 0) for s in measured),
            "state_mean": statistics.mean(s.get("state_bytes", 0) for s in measured),
            "cache_share": sum(s.get("cache_hits", 0) for s in measured) / max(1, tuples),
            "bytes_read": statistics.mean(s.get("master_bytes_read", 0) for s in measured),
            "bytes_read_max": max(s.get("master_bytes_read", 0) for s in measured),
            "by_state": {state: statistics.mean(t) for state, t in by_state[mode].items()},
        }
    result["bound"] = _least_state_at_ssbj_rate(result, metrics["ssbj"], sampler, table, spec.key)
    case.store.dispose()
    return result


def _least_state_at_ssbj_rate(  # type: ignore[no-untyped-def]
    result: dict, ssbj_steps: dict[int, dict[str, float]], sampler, table: pa.Table, key: str
) -> StateBound | None:
    """Theorem 1's least SSBJ state (``joins.ssbj.cache.least_state``) at the tuples per
    step SSBJ ran at, with the sampler's exact stream probabilities, the master's rows per
    value and the stage's own tuple sizes (those its state bytes are counted in)."""
    steps = list(ssbj_steps.values())
    v_s = [s["pending_bytes"] / s["pending_rows"] for s in steps if s.get("pending_rows")]
    v_r = [s["cache_bytes"] / s["cache_rows"] for s in steps if s.get("cache_rows")]
    if not (v_s and v_r and result["ssbj"]["tuples_per_step"]):
        return None
    values, counts = np.unique(table.column(key).to_numpy(), return_counts=True)
    rows_of = dict(zip(values.tolist(), counts.tolist(), strict=True))
    k = result["k"]
    return least_state(
        sampler.probabilities.tolist(),
        [rows_of[v] for v in sampler.ranked_keys.tolist()],
        # H_S as the stage counts it, after the step's expiry: k - 1 chunks.
        (k - 1) * result["ssbj"]["tuples_per_step"],
        result["rows"] / k,
        TupleSizes(stream_bytes=v_s[-1], master_bytes=v_r[-1]),
    )


def warn_unless_whole_periods(cycles: int) -> None:
    """Warn when ``cycles`` measured R-cycles are not whole periods of SSBJ's incrementing,
    switching and phase-out cycles, whose steps cost differently."""
    if cycles % 3:
        logger.warning(
            "%d measured R-cycle(s) are not whole periods of SSBJ's three cycle states, "
            "whose costs differ: its figures depend on where the window falls",
            cycles,
        )


def meshjoin_runs(result: dict) -> list[str]:
    """The MESHJOIN modes of a memory result that had input in their measured steps: a
    multiple whose backlog ran out before them says nothing."""
    return [m for m in result["modes"] if m != "ssbj" and result[m]["tuples_per_step"] > 0]


def state_at_equal_rate(result: dict) -> tuple[float | None, str]:
    """MESHJOIN's state where its service rate equals SSBJ's at M, over SSBJ's state.

    MESHJOIN ran at several multiples of M. Going up the multiples, the first whose rate
    reaches SSBJ's and the one below it bracket SSBJ's rate; MESHJOIN's state is
    interpolated linearly in the rate between them. A multiple that had no input in its
    measured steps (the backlog ran out) says nothing and is left out. None when no tested
    multiple reaches SSBJ's rate (the text then gives the largest one's state ratio).
    """
    target = result["ssbj"]["rate"]
    ssbj_state = max(1.0, result["ssbj"]["state_mean"])
    points = [
        (result["multiples"][m], result[m]["rate"], result[m]["state_mean"])
        for m in meshjoin_runs(result)
    ]
    points.sort()
    if not points:
        return None, "no MESHJOIN run with input"
    for index, (multiple, rate, state) in enumerate(points):
        if rate < target:
            continue
        if index == 0:
            return state / ssbj_state, f"at {multiple:g} x M (MESHJOIN already as fast)"
        _, r0, s0 = points[index - 1]
        interpolated = s0 + (state - s0) * (target - r0) / max(1e-9, rate - r0)
        return interpolated / ssbj_state, "interpolated"
    return None, f"> {points[-1][2] / ssbj_state:.2f}x (no tested M reached SSBJ's rate)"


@dataclass(frozen=True)
class StepCostLine:
    """MESHJOIN's step time and state as straight lines in its tuples per step ``w``,
    fitted by least squares over every memory multiple it ran at: a step costs
    ``T = fixed + per_tuple * w`` (MESHJOIN's cost model: a fixed part, the partition's
    scan among it, and a part per tuple of its queue), its state is
    ``state = state_fixed + state_per_tuple * w`` (Eq. 1: the disk buffer, and k chunks
    of w tuples). Its service rate ``w / T`` then rises towards ``1 / per_tuple``, which
    no memory passes."""

    fixed: float
    per_tuple: float
    state_fixed: float
    state_per_tuple: float

    @property
    def rate_ceiling(self) -> float:
        return math.inf if self.per_tuple <= 0 else 1 / self.per_tuple

    def state_at(self, rate: float) -> float | None:
        """The state at which the fitted MESHJOIN serves ``rate`` tuples a second; None
        at or above its ceiling."""
        if rate * self.per_tuple >= 1:
            return None
        tuples = rate * self.fixed / (1 - rate * self.per_tuple)
        return self.state_fixed + self.state_per_tuple * tuples


def meshjoin_cost_line(result: dict) -> StepCostLine | None:
    """:class:`StepCostLine` of the MESHJOIN runs with input; None with fewer than three
    (two points always fit a line: nothing would check it)."""
    points = [
        (result[m]["tuples_per_step"], result[m]["seconds"], result[m]["state_mean"])
        for m in meshjoin_runs(result)
    ]
    if len(points) < 3:
        return None
    w = np.array([p[0] for p in points], float)
    per_tuple, fixed = np.polyfit(w, np.array([p[1] for p in points], float), 1)
    state_per_tuple, state_fixed = np.polyfit(w, np.array([p[2] for p in points], float), 1)
    return StepCostLine(float(fixed), float(per_tuple), float(state_fixed), float(state_per_tuple))


def state_at_equal_rate_fitted(result: dict) -> str:
    """MESHJOIN's state at SSBJ's rate over SSBJ's state, from :func:`meshjoin_cost_line`:
    every multiple's step time counts, where the interpolation uses the two around SSBJ's
    rate (near MESHJOIN's ceiling its rates differ by less than their noise)."""
    line = meshjoin_cost_line(result)
    if line is None:
        return "n/a (fewer than 3 MESHJOIN runs)"
    target = result["ssbj"]["rate"]
    ceiling = f"ceiling {line.rate_ceiling:,.0f}/s"
    state = line.state_at(target)
    if state is None:
        return f"unbounded: SSBJ's rate is at or above MESHJOIN's {ceiling}"
    ratio = state / max(1.0, result["ssbj"]["state_mean"])
    return f"{ratio:.2f}x (SSBJ at {target * line.per_tuple:.0%} of MESHJOIN's {ceiling})"


def render_memory(results: Sequence[dict], args: argparse.Namespace) -> str:
    lines = [
        f"TPC-H SF{args.scale:g}, memory M = share x |R|·v_R for SSBJ, "
        f"MESHJOIN at {', '.join(f'{m:g}' for m in sorted({1.0, *args.mesh_multiples}))} x M, "
        f"k={args.memory_partitions}, backlog {args.backlog:,} tuples in commits of "
        f"{args.commit:,}, {args.memory_measured_cycles} measured R-cycle(s) after "
        f"{args.memory_warmup_cycles} warm-up cycles, master written as one file, local[2] "
        "on 2 cores",
        "",
        "| master | z | share | M (MB) | mode | tuples/step | step s | step s by R-cycle state (incrementing, switching, phase-out) | service rate (tuples/s) | state mean / M | state max / M | cache share | master MB read/step (mean, max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for mode in r["modes"]:
            m = r[mode]
            states = ", ".join(
                f"{m['by_state'][s]:.3f}" if s in m["by_state"] else "-" for s in CycleState
            )
            lines.append(
                f"| {r['master']} | {r['z']:g} | {r['share']:g} | {r['budget'] / 1e6:.2f} | {mode} | "
                f"{m['tuples_per_step']:,.0f} | {m['seconds']:.3f} | {states} | {m['rate']:,.0f} | "
                f"{m['state_mean'] / r['budget']:.2f} | "
                f"{m['state_max'] / r['budget']:.2f} | {m['cache_share']:.0%} | "
                f"{m['bytes_read'] / 1e6:.2f}, {m['bytes_read_max'] / 1e6:.2f} |"
            )
    # rate ratio = (tuples per step ratio) x (step time ratio). At equal memory the cache
    # can raise the tuples per step by at most 1 / (1 - cache share): only the misses wait
    # in H_S, and the cache itself takes part of M.
    lines += [
        "",
        "| master | z | share | service rate SSBJ / MESHJOIN at equal M | tuples/step SSBJ / MESHJOIN "
        "| step time MESHJOIN / SSBJ | bound 1 / (1 - SSBJ cache share) "
        "| state MESHJOIN / SSBJ at equal service rate (mean bytes) "
        "| the same from MESHJOIN's fitted step cost T = F + a·w "
        "| least SSBJ state at its rate (Theorem 1) / measured "
        "| bound: MESHJOIN / least SSBJ state at that rate (its cache share) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ssbj, mesh = r["ssbj"], r["meshjoin"]
        if not (ssbj["rate"] and mesh["rate"]):
            void = "void: a mode had no input in the measured steps (raise --backlog)"
            lines.append(f"| {r['master']} | {r['z']:g} | {r['share']:g} | {void} | | | | | | | |")
            continue
        ratio, how = state_at_equal_rate(r)
        equal_rate = f"{ratio:.2f}x ({how})" if ratio is not None else how
        lines.append(
            f"| {r['master']} | {r['z']:g} | {r['share']:g} | {ssbj['rate'] / mesh['rate']:.2f}x | "
            f"{ssbj['tuples_per_step'] / mesh['tuples_per_step']:.2f}x | "
            f"{mesh['seconds'] / ssbj['seconds']:.2f}x | "
            f"{1 / max(1e-9, 1 - ssbj['cache_share']):.2f}x | {equal_rate} | "
            f"{state_at_equal_rate_fitted(r)} | "
            f"{_bound_cells(r.get('bound'), ssbj['state_mean'])} |"
        )
    return "\n".join(lines)


def _bound_cells(bound: StateBound | None, measured: float) -> str:
    if bound is None:
        return "n/a (no pending or cached rows measured) | n/a"
    return (
        f"{bound.ssbj_bytes / max(1.0, measured):.2f} | "
        f"{bound.ratio:.2f}x ({bound.cache_share:.0%})"
    )


def _table_versions(root: Path) -> int:
    """Sum of the versions of every Delta table under ``root`` (+1 each: version 0 counts)."""
    total = 0
    for log in root.rglob("_delta_log"):
        versions = [int(p.name.split(".")[0]) for p in log.glob("*.json")]
        total += max(versions) + 1 if versions else 0
    return total


def run_anatomy_case(spark, tpch: Path, master: str, args: argparse.Namespace) -> list[dict]:  # type: ignore[no-untyped-def]
    """Jobs, commits and seconds per step for every mode, with input and idle."""
    spec = MASTERS[master]
    root = Path(tempfile.mkdtemp(prefix=f"ssbj-anatomy-{master}-"))
    case = Case.open(spark, build_config(root, master, args.partitions))
    layout = case.layout
    table = _plain(pq.read_table(tpch / spec.file)).select(spec.columns)
    case.load_master(spark.createDataFrame(table, arrow_to_spark(table.schema)).coalesce(1))
    sampler = ZipfSampler(
        np.unique(table.column(spec.key).to_numpy()), 1.0, np.random.default_rng(7)
    )
    bronze = case.create_bronze()
    arrow_schema = pa.schema(DeltaTable(bronze).schema().to_arrow())
    tracker = spark.sparkContext.statusTracker()
    rows: list[dict] = []
    warm = 3 * args.partitions
    # With input for one R-cycle, then without for one R-cycle and two steps more: the
    # tuples still pending expire during the first k idle steps, then nothing waits.
    for step in range(warm + 2 * args.partitions + 2):
        idle = step >= warm + args.partitions
        if not idle:
            n = args.batch
            batch = stream_batch(spec, step * n, sampler.draw(n), np.zeros(n), step)
            write_deltalake(bronze, batch.cast(arrow_schema), mode="append")
        for mode in MODES:
            stage_tables = Path(layout.operator_state(mode, "x")).parent
            output = Path(layout.staged(f"out_{mode}"))
            before = _table_versions(stage_tables) + _table_versions(output)
            operator = case.store.operator_state(mode) or {}
            waiting = bool(operator.get("chunks"))
            group = f"{mode}-{step}"
            spark.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            case.runner.run_stage_step(case.config.stage(mode), f"a{step}")
            seconds = time.perf_counter() - started
            if step >= warm:
                rows.append(
                    {
                        "mode": mode,
                        "input": (
                            "w"
                            if not idle
                            else ("none, H_S waiting" if waiting else "none, H_S empty")
                        ),
                        "seconds": seconds,
                        "jobs": len(tracker.getJobIdsForGroup(group)),
                        "commits": _table_versions(stage_tables) + _table_versions(output) - before,
                    }
                )
        logger.info("anatomy %s step %d done", master, step + 1)
    spark.sparkContext.setJobGroup("", "")
    case.store.dispose()
    return rows


def render_anatomy(results: dict[str, list[dict]], args: argparse.Namespace) -> str:
    lines = [
        f"TPC-H SF{args.scale:g}, w={args.batch} tuples/step (z = 1), k={args.partitions}; "
        f"means over one R-cycle with input and k + 2 steps without, after "
        f"{3 * args.partitions} warm-up steps; local[2] on 2 cores",
        "",
        "| master | mode | input | step s | Spark jobs/step | Delta commits/step |",
        "|---|---|---|---|---|---|",
    ]
    for master, rows in results.items():
        for mode in MODES:
            for kind in ("w", "none, H_S waiting", "none, H_S empty"):
                picked = [r for r in rows if r["mode"] == mode and r["input"] == kind]
                if not picked:  # the plain join keeps nothing waiting
                    continue
                lines.append(
                    f"| {master} | {mode} | {kind} | "
                    f"{statistics.mean(r['seconds'] for r in picked):.2f} | "
                    f"{statistics.mean(r['jobs'] for r in picked):.1f} | "
                    f"{statistics.mean(r['commits'] for r in picked):.2f} |"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--zipf", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5])
    parser.add_argument(
        "--masters", nargs="+", default=["customer", "partsupp"], choices=list(MASTERS)
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--experiment", choices=["rate", "memory", "anatomy"], default="rate")
    parser.add_argument(
        "--memory-share",
        type=float,
        nargs="+",
        default=[0.3],
        help="memory experiment: M as shares of the master's |R|·v_R bytes, one case each",
    )
    parser.add_argument("--memory-partitions", type=int, default=5)
    parser.add_argument(
        "--memory-measured-cycles",
        type=int,
        default=3,
        help=(
            "memory experiment: R-cycles measured. SSBJ's cycles differ in cost (an "
            "incrementing cycle counts s_count for every pending value, a switching cycle "
            "collects s_B, a phase-out cycle does neither): a multiple of 3 measures whole "
            "periods of the three"
        ),
    )
    parser.add_argument(
        "--memory-warmup-cycles",
        type=int,
        default=5,
        help=(
            "memory experiment: R-cycles before the measured ones; SSBJ's cache is filled "
            "at cycle 3 and refilled from a whole cycle's counts at cycle 6 (steady state)"
        ),
    )
    parser.add_argument(
        "--mesh-multiples",
        type=float,
        nargs="+",
        default=[1.0],
        help="memory experiment: MESHJOIN also at these multiples of M (equal service rate)",
    )
    parser.add_argument("--backlog", type=int, default=150_000)
    parser.add_argument("--commit", type=int, default=1_000)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("warehouse", "pipeline", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = build_session(
        SparkSettings(app_name="ssbj-bench", conf={"spark.sql.shuffle.partitions": "4"})
    )
    tpch = generate_tpch(args.scale, Path("var/bench"))
    if args.experiment == "anatomy":
        table = render_anatomy(
            {m: run_anatomy_case(spark, tpch, m, args) for m in args.masters}, args
        )
    elif args.experiment == "memory":
        results = [
            run_memory_case(spark, tpch, m, z, share, args)
            for m in args.masters
            for z in args.zipf
            for share in args.memory_share
        ]
        table = render_memory(results, args)
    else:
        results = [run_case(spark, tpch, m, z, args) for m in args.masters for z in args.zipf]
        table = render(results, args)
    args.out = args.out or Path(f"benchmarks/results/ssbj-{args.experiment}.md")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
