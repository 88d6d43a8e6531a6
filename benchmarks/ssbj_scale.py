"""SSBJ at scale: each equi mode against the plain joins a user would write, on TPC-H.

    python -m benchmarks.ssbj_scale [--shapes 1:partsupp:20000:1:4 10:partsupp:20000:1:8 ...]
                                    [--cycles 3] [--warmup-cycles 2] [--out FILE]

A shape is ``SCALE:MASTER:BATCH:Z:K``: the TPC-H scale factor, the master table (``partsupp``:
many-to-many on partkey; ``customer``: one-to-many on custkey, with string columns), the
stream tuples per batch, the Zipf skew of the stream's join key (one ranking: the same keys
stay hot in every batch) and k, the master partitions of one R-cycle. The default list
(about 45 minutes on 2 cores with one measured cycle, over an hour with three) is issue
35's grid, SF1, SF10 and SF30 partsupp and SF10 customer, batches of 20k and 200k, z in
{0, 1, 1.5}, with SF0.1 partsupp (80k rows) beside it, where a 200k batch is larger than
the master; ``30:partsupp:200000:1:16`` is not in it
(another half hour).

Per batch, in one process and one warm Spark session (local[2]), on the same batches:

- ``baseline``, ``meshjoin``, ``ssbj``, ``auto``: the pipeline's equi stage in each mode
  (``PipelineRunner.run_stage_step``: one run, its Delta commits and bookkeeping; a
  stateful stage's run takes the steps its freshness bound asks, ``--bound``: its whole
  R-cycle of k steps a batch at the default bound of 1 batch, one step at ``--bound k``);
- ``spark``: the plain PySpark a user writes without the pipeline: read the batch's Parquet
  file, join it to the whole master (``spark.read.format("delta")``), append the result to a
  Delta table;
- ``slice``: the same plain PySpark join, of what an SSBJ step joins: the batch plus as many
  waiting tuples as SSBJ's H_S held before the step, against the same 1/k slice of the master
  (the files of partition p of ``joins.ssbj.mesh_partitions``), appended to a Delta table. Issue
  35's "a step costs its data" compares an SSBJ step to it;
- ``duckdb``: DuckDB joining the batch's Parquet file to the master's Parquet files, written
  to a Parquet file.

The stateful modes (``meshjoin``, ``ssbj``, ``auto``) run every step; the others from one
untimed step before the measured ones (after ``--warmup-cycles`` R-cycles: SSBJ's cache
fills at the first phase-out), ``baseline`` from a bronze table of its own that gets only
those batches (a stateless join has nothing to warm up). After the measured steps the
stateful stages drain (k + 1 idle steps), then one more idle SSBJ step is timed (nothing
pending). Every output but ``slice``'s (a cost probe joining one slice, not a result) is
checked against an independent DuckDB join of the batches it saw with the master: the
whole multiset of (tuple id, join key, a master column) rows, duplicates included.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from benchmarks.revision import has_uncommitted_changes, short_commit
from benchmarks.ssbj_bench import (
    MASTERS,
    Case,
    _table_versions,
    build_config,
    stream_batch,
    warn_unless_whole_periods,
)
from demo.data import ZipfSampler, _plain, generate_tpch
from joins.ssbj.mesh_partitions import partition_by_bytes
from pipeline.schemas import bronze_schema
from pipeline.stage_config import EquiStage
from warehouse.delta import AppTransaction
from warehouse.spark import SparkSettings, build_session

logger = logging.getLogger("bench")

STAGE_MODES = {
    "baseline": {"mode": "baseline"},
    "meshjoin": {"mode": "meshjoin"},
    "ssbj": {"mode": "ssbj"},
    "auto": {"mode": "auto"},
}
STATEFUL = ("meshjoin", "ssbj", "auto")
PLAIN_MODES = ("spark", "slice", "duckdb")
MODES = (*STAGE_MODES, *PLAIN_MODES)
MASTER_CHECK_COLUMN = {"partsupp": "ps_suppkey", "customer": "c_name", "customer_wide": "c_comment"}
DEFAULT_SHAPES = (
    "0.1:partsupp:20000:1:4",
    "0.1:partsupp:200000:1:4",
    "1:partsupp:20000:1:4",
    "1:partsupp:200000:1:4",
    "10:partsupp:20000:0:8",
    "10:partsupp:20000:1:8",
    "10:partsupp:20000:1.5:8",
    "10:customer:20000:1:8",
    "10:partsupp:200000:1:8",
    "30:partsupp:20000:1:16",
)


@dataclass(frozen=True)
class Shape:
    """One benchmark case: master, batch size, skew and k."""

    scale: float
    master: str
    batch: int
    z: float
    k: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        parts = text.split(":")
        if len(parts) != 5:
            raise ValueError(f"a shape is SCALE:MASTER:BATCH:Z:K, found {text!r}")
        scale, master, batch, z, k = parts
        if master not in MASTERS:
            raise ValueError(f"shape {text!r}: master must be one of {sorted(MASTERS)}")
        return cls(float(scale), master, int(batch), float(z), int(k))

    @property
    def label(self) -> str:
        return f"SF{self.scale:g} {self.master}, w={self.batch:,}, z={self.z:g}, k={self.k}"


@dataclass
class ModeTimes:
    """Measured steps of one mode."""

    seconds: list[float] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    commits: list[int] = field(default_factory=list)
    master_bytes: list[float] = field(default_factory=list)


@dataclass
class ShapeResult:
    shape: Shape
    master_rows: int
    master_bytes: int
    modes: dict[str, ModeTimes]
    state_bytes: dict[str, float]
    pending_rows: dict[str, float]
    cache_share: float
    auto_choice: str
    idle_seconds: float
    mismatches: list[str]


class PlainJobs:
    """The plain PySpark and DuckDB joins of one shape, in the benchmark's warm session."""

    def __init__(self, spark: Any, root: Path, master_path: str, spec: Any, files: list[str]):
        self.spark = spark
        self.root = root
        self.master_path = master_path
        self.spec = spec
        self.files = files

    def spark_join(self, batch_file: Path) -> None:
        master = self.spark.read.format("delta").load(self.master_path)
        self._join_and_append(batch_file, master, self.root / "out_spark")

    def slice_join(self, batch_file: Path, slice_files: list[str]) -> None:
        master = self.spark.read.parquet(*slice_files)
        self._join_and_append(batch_file, master, self.root / "out_slice")

    def _join_and_append(self, batch_file: Path, master: Any, target: Path) -> None:
        batch = self.spark.read.parquet(str(batch_file))
        joined = batch.join(master, batch[self.spec.stream_key] == master[self.spec.key])
        joined.write.format("delta").mode("append").save(str(target))

    def duckdb_join(self, con: Any, batch_file: Path, index: int) -> None:
        files = ", ".join(f"'{f}'" for f in self.files)
        target = self.root / "out_duckdb" / f"{index:05d}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        con.execute(
            f"COPY (SELECT * FROM read_parquet('{batch_file}') b JOIN read_parquet([{files}]) m "
            f"ON b.{self.spec.stream_key} = m.{self.spec.key}) TO '{target}' (FORMAT parquet)"
        )


def _latest(metrics: dict[int, dict[str, float]], name: str) -> float:
    return metrics[max(metrics)].get(name, 0.0) if metrics else 0.0


def _spark_master(spark: Any, file: Path, columns: Sequence[str]) -> Any:
    """The master's columns as Spark reads them, typed as every engine reads them (decimals
    as doubles, integers as bigint), without bringing 24M rows through the driver."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    frame = spark.read.parquet(str(file)).select(*columns)
    for f in frame.schema.fields:
        if isinstance(f.dataType, T.DecimalType):
            frame = frame.withColumn(f.name, F.col(f.name).cast("double"))
        elif isinstance(f.dataType, (T.IntegerType, T.ShortType, T.ByteType)):
            frame = frame.withColumn(f.name, F.col(f.name).cast("bigint"))
    return frame


BOUND_TEXT = {"1": "1 batch (k SSBJ steps a batch)", "k": "k batches (one SSBJ step a batch)"}


def bound_of(shape: Shape, args: argparse.Namespace) -> str:
    """Every stage's freshness bound, in batches (one batch a run): 1 (a batch's tuples
    answered in its own run; a stateful stage takes its whole R-cycle, k steps, a batch), or
    k (one step a batch, the paper's stream: a tuple waits up to k batches)."""
    return f"{shape.k if args.bound == 'k' else 1} intervals"


def run_shape(spark: Any, shape: Shape, args: argparse.Namespace) -> ShapeResult:
    import duckdb

    spec = MASTERS[shape.master]
    tpch = generate_tpch(shape.scale, Path("var/bench"), (spec.table,))
    root = Path(tempfile.mkdtemp(prefix=f"ssbj-scale-{shape.master}-", dir=args.tmp))
    config = build_config(root, shape.master, shape.k, STAGE_MODES, bound=bound_of(shape, args))
    # The baseline reads a bronze of its own that gets only the batches it is timed on (and
    # one before, to warm its code paths): a stateless join has nothing to warm up, and
    # skipping it there saves the warm-up steps' whole-master scans.
    config["streams"]["sb"] = {**config["streams"]["s"], "landing": str(root / "landing-b")}
    for stage in config["stages"]:
        if stage["name"] == "baseline":
            stage["input"] = "sb"
    case = Case.open(spark, config)
    frame = _spark_master(spark, tpch / spec.file, spec.columns)
    master_path = case.load_master(frame.repartition(4 * shape.k))
    snapshot = case.engine.snapshot(master_path)
    files = [str(Path(master_path) / f.path) for f in snapshot.files]
    sizes = {str(Path(master_path) / f.path): f.size_bytes for f in snapshot.files}
    slices = partition_by_bytes(list(sizes.items()), shape.k)
    keys = np.unique(pq.read_table(tpch / spec.file, columns=[spec.key]).column(0).to_numpy())
    master_rows = snapshot.num_records or 0
    rng = np.random.default_rng(42)
    sampler = ZipfSampler(keys, shape.z, rng)
    bronze = case.create_bronze()
    stream_schema = bronze_schema(case.config.streams["s"])
    baseline_bronze = case.layout.bronze("sb")
    case.engine.create_table(baseline_bronze, stream_schema)
    plain = PlainJobs(spark, root, master_path, spec, files)
    con = duckdb.connect()
    tracker = spark.sparkContext.statusTracker()
    warmup = args.warmup_cycles * shape.k
    plain_from = warmup - 1  # one untimed step warms the stateless modes
    steps = warmup + args.cycles * shape.k
    times = {m: ModeTimes() for m in MODES}
    batches: list[pa.Table] = []
    pending_before = 0.0
    for step in range(steps):
        measured = step >= warmup
        stateless = step >= plain_from
        batch = stream_batch(
            spec, step * shape.batch, sampler.draw(shape.batch), rng.random(shape.batch), step
        )
        batches.append(batch)
        frame = spark.createDataFrame(batch, stream_schema)
        case.engine.append(bronze, frame, AppTransaction("bench", step))
        if stateless:
            case.engine.append(baseline_bronze, frame, AppTransaction("bench", step))
        batch_file = root / "batches" / f"{step:05d}.parquet"
        batch_file.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(batch.drop(["_source_file", "_batch_id"]), batch_file)
        ran = [m for m in STAGE_MODES if stateless or m in STATEFUL]
        # A batch is one scheduled command's run, and each command decides ``auto`` anew
        # from the steps measured so far (one registry serves the whole benchmark).
        case.runner.drivers.decide_again()
        for mode in ran:
            stage_tables = Path(case.layout.operator_state(mode, "x")).parent
            output = Path(case.layout.staged(f"out_{mode}"))
            before = _table_versions(stage_tables) + _table_versions(output)
            group = f"{mode}-{step}"
            spark.sparkContext.setJobGroup(group, group)
            started = time.perf_counter()
            case.runner.run_stage_step(case.config.stage(mode), f"s{step}")
            seconds = time.perf_counter() - started
            if measured:
                t = times[mode]
                t.seconds.append(seconds)
                t.jobs.append(len(tracker.getJobIdsForGroup(group)))
                t.commits.append(_table_versions(stage_tables) + _table_versions(output) - before)
        step_metrics = case.metrics()  # the runner recorded each stage's step (read once)
        if measured:
            for mode in ran:
                times[mode].master_bytes.append(_latest(step_metrics[mode], "master_bytes_read"))
        # What SSBJ held in H_S after this step: the waiting tuples of the next slice join.
        pending_after = _latest(step_metrics["ssbj"], "pending_rows")
        if stateless:
            # What SSBJ's step joined: the batch and the tuples waiting in H_S before it.
            waiting = int(pending_before)
            recent = pa.concat_tables(batches[-shape.k - 1 : -1]) if len(batches) > 1 else None
            extra = recent.slice(0, min(waiting, recent.num_rows)) if recent else None
            slice_file = root / "slices" / f"{step:05d}.parquet"
            slice_file.parent.mkdir(parents=True, exist_ok=True)
            with_waiting = batch if extra is None else pa.concat_tables([batch, extra])
            pq.write_table(with_waiting.drop(["_source_file", "_batch_id"]), slice_file)
            slice_files = slices[step % shape.k]
            jobs: dict[str, Callable[[], None]] = {
                "spark": partial(plain.spark_join, batch_file),
                "slice": partial(plain.slice_join, slice_file, slice_files),
                "duckdb": partial(plain.duckdb_join, con, batch_file, step),
            }
            read = {
                "spark": float(snapshot.size_bytes),
                "slice": float(sum(sizes[f] for f in slice_files)),
                "duckdb": float(snapshot.size_bytes),
            }
            for mode, job in jobs.items():
                group = f"{mode}-{step}"
                spark.sparkContext.setJobGroup(group, group)
                started = time.perf_counter()
                job()
                if measured:
                    t = times[mode]
                    t.seconds.append(time.perf_counter() - started)
                    t.jobs.append(len(tracker.getJobIdsForGroup(group)))
                    t.commits.append(0 if mode == "duckdb" else 1)
                    t.master_bytes.append(read[mode])
        pending_before = pending_after
        logger.info("%s: step %d/%d", shape.label, step + 1, steps)
    spark.sparkContext.setJobGroup("", "")
    metrics = case.metrics()
    state_bytes = {
        m: _latest(metrics[m], "pending_bytes") + _latest(metrics[m], "cache_bytes")
        for m in STATEFUL
    }
    pending_rows = {m: _latest(metrics[m], "pending_rows") for m in STATEFUL}
    measured_steps = [v for s, v in sorted(metrics["ssbj"].items())][warmup:]
    tuples = sum(s.get("tuples_in", 0) for s in measured_steps)
    cache_share = sum(s.get("cache_hits", 0) for s in measured_steps) / max(1.0, tuples)
    auto_stage = case.config.stage("auto")
    assert isinstance(auto_stage, EquiStage)
    auto_choice = case.runner.drivers.choice(auto_stage).mode
    for drain in range(shape.k + 1):
        for mode in STATEFUL:
            case.runner.run_stage_step(case.config.stage(mode), f"drain{drain}")
    started = time.perf_counter()
    case.runner.run_stage_step(case.config.stage("ssbj"), "idle")
    idle_seconds = time.perf_counter() - started
    mismatches = check_outputs(case, root, shape, spec, batches, plain_from * shape.batch)
    case.store.dispose()
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return ShapeResult(
        shape,
        master_rows,
        snapshot.size_bytes,
        times,
        state_bytes,
        pending_rows,
        cache_share,
        auto_choice,
        idle_seconds,
        mismatches,
    )


def check_outputs(
    case: Case,
    root: Path,
    shape: Shape,
    spec: Any,
    batches: Sequence[pa.Table],
    first_stateless: int,
) -> list[str]:
    """Each output's (sid, key, master column) multiset against DuckDB's join of its input."""
    import duckdb

    column = MASTER_CHECK_COLUMN[shape.master]
    picked = ["sid", spec.stream_key, column]
    con = duckdb.connect()
    stream = pa.concat_tables(batches).select(["sid", spec.stream_key])
    master = pq.read_table(
        generate_tpch(shape.scale, Path("var/bench"), (spec.table,)) / spec.file,
        columns=[spec.key, column],
    )
    con.register("stream", stream)
    con.register("master", _plain(master))
    con.execute(
        f"CREATE TABLE oracle AS SELECT s.sid, s.{spec.stream_key}, m.{column} FROM stream s "
        f"JOIN master m ON s.{spec.stream_key} = m.{spec.key}"
    )
    outputs: dict[str, tuple[pa.Table, int]] = {}
    for mode in STAGE_MODES:
        table = DeltaTable(case.layout.staged(f"out_{mode}")).to_pyarrow_table(columns=picked)
        outputs[mode] = (table, 0 if mode in STATEFUL else first_stateless)
    for mode in ("spark",):
        table = DeltaTable(str(root / f"out_{mode}")).to_pyarrow_table(columns=picked)
        outputs[mode] = (table, first_stateless)
    duck = pa.concat_tables(
        [pq.read_table(p, columns=picked) for p in sorted((root / "out_duckdb").glob("*.parquet"))]
    )
    outputs["duckdb"] = (duck, first_stateless)
    problems = []
    for mode, (table, first) in outputs.items():
        con.register("out", _plain(table))
        ((missing, extra),) = con.execute(
            f"SELECT (SELECT count(*) FROM (SELECT * FROM oracle WHERE sid >= {first} "
            f"EXCEPT ALL SELECT * FROM out)), (SELECT count(*) FROM (SELECT * FROM out "
            f"EXCEPT ALL SELECT * FROM oracle WHERE sid >= {first}))"
        ).fetchall()
        if missing or extra:
            problems.append(f"{mode}: {missing} oracle rows missing, {extra} rows not in oracle")
        con.unregister("out")
    return problems


def render(results: Sequence[ShapeResult], args: argparse.Namespace, commit: str) -> str:
    lines = [
        f"Commit {commit}; {args.warmup_cycles} warm-up R-cycle(s), {args.cycles} measured; "
        f"freshness bound {BOUND_TEXT[args.bound]}; "
        "local[2] on 2 cores; seconds are means over the measured batches",
        "",
        "| shape | master rows | mode | s/batch | vs spark | master MB read/batch | Spark jobs/step "
        "| Delta commits/step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        spark_s = statistics.mean(r.modes["spark"].seconds)
        for mode in MODES:
            t = r.modes[mode]
            if not t.seconds:
                continue
            mean = statistics.mean(t.seconds)
            lines.append(
                f"| {r.shape.label} | {r.master_rows:,} | {mode} | {mean:.2f} | "
                f"{mean / spark_s:.2f}x | {statistics.mean(t.master_bytes) / 1e6:.1f} | "
                f"{statistics.mean(t.jobs):.1f} | {statistics.mean(t.commits):.1f} |"
            )
    lines += [
        "",
        "| shape | SSBJ step / slice join (goal <= 1.5x) | spark / SSBJ | baseline / SSBJ "
        "| auto (picks) / best of baseline, SSBJ (goal <= 1.2x) | state MESHJOIN / SSBJ at "
        "equal w | SSBJ cache share | idle step s (goal < 0.1) | outputs vs DuckDB oracle |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        means = {m: statistics.mean(t.seconds) for m, t in r.modes.items() if t.seconds}
        best = min(means["baseline"], means["ssbj"])
        lines.append(
            f"| {r.shape.label} | {means['ssbj'] / means['slice']:.2f}x | "
            f"{means['spark'] / means['ssbj']:.2f}x | {means['baseline'] / means['ssbj']:.2f}x | "
            f"{means['auto'] / best:.2f}x ({r.auto_choice}) | "
            f"{r.state_bytes['meshjoin'] / max(1.0, r.state_bytes['ssbj']):.2f}x | "
            f"{r.cache_share:.0%} | {r.idle_seconds:.3f} | "
            f"{'equal' if not r.mismatches else '; '.join(r.mismatches)} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES))
    parser.add_argument(
        "--cycles",
        type=int,
        default=3,
        help=(
            "measured R-cycles: SSBJ's incrementing, switching and phase-out cycles cost "
            "differently, so a multiple of 3 measures whole periods (1 measures the phase-out "
            "cycle after 2 warm-up cycles, SSBJ's cheapest)"
        ),
    )
    parser.add_argument("--warmup-cycles", type=int, default=2)
    parser.add_argument(
        "--bound",
        choices=("1", "k"),
        default="1",
        help=(
            "every stage's freshness bound in batches: 1 (the product's default: a batch's "
            "tuples are answered in its run, so the stateful modes take k steps a batch) or k "
            "(one step a batch, the paper's stream, as this benchmark ran before the bound "
            "existed; then 'SSBJ step / slice' compares one step with the slice it joins)"
        ),
    )
    parser.add_argument("--tmp", type=Path, default=None, help="folder for the warehouses")
    parser.add_argument("--keep", action="store_true", help="keep each shape's warehouse")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ssbj-scale.md"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    warn_unless_whole_periods(args.cycles)
    try:
        shapes = [Shape.parse(s) for s in args.shapes]
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("warehouse", "pipeline", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = build_session(
        SparkSettings(app_name="ssbj-scale", conf={"spark.sql.shuffle.partitions": "4"})
    )
    # The code measured is the code at the start: a long run outlives later commits.
    commit = short_commit(Path.cwd()) + (
        " (uncommitted changes)" if has_uncommitted_changes(Path.cwd()) else ""
    )
    results = []
    for shape in shapes:
        results.append(run_shape(spark, shape, args))
        table = render(results, args, commit)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")  # after each shape: a long run keeps what it measured
    print(table)
    return 1 if any(r.mismatches for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
