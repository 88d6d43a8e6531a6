"""The continuous shape: SSBJ as a stream (``enrich stream``) against the plain join run once
per freshness bound, at the same bound, on the same micro-batch files.

    python -m benchmarks.stream_cost [--scale 10] [--tuples 1500] [--every 3]
                                     [--minutes 10] [--bound 600] [--trigger T]
                                     [--partitions 8] [--out FILE]

A producer places one Parquet file of ``--tuples`` Zipf(1) lineitem tuples every
``--every`` seconds for ``--minutes`` into the landing zone (temporary name, then rename),
against TPC-H partsupp at ``--scale``. Each mode runs in a process of its own, started
before the first file lands, and the modes run side by side, in the same window: each file
lands in every mode's landing zone at the same moment, so a change in the machine's speed
during the run touches every mode alike (each is idle most of the window; run one after
the other, the plain job's cost moved 23.8 -> 41.6 CPU s between two sessions):

- ``stream``: ``enrich stream`` on a one-stage pipeline (SSBJ, k = ``--partitions``,
  inner join, a value-range suite, ``freshness.stream_within`` = the bound): its trigger
  is derived from the bound (bound / (k + 1)) unless ``--trigger`` is given; every
  micro-batch ingests, takes one SSBJ step and publishes to gold. A long-lived stream has
  a hot cache built by its history: before its measured process starts, a history of
  3k + 1 steps (each of a trigger's worth of tuples, landed every 3 s under a 3 s trigger)
  runs to the end, so that SSBJ's R-cycle machine has switched its hot values into H_R
  (Algorithm 1's first phase-out is at step 2k);
- ``plain``: a plain PySpark script in one warm session that, every ``--bound`` seconds,
  reads the files landed since its last pass, joins them to the master (a broadcast hash
  join of the batch) and appends the result to a Delta table (delta-spark): the plain
  join run once per bound over the tuples gathered since.

Before the measured window, a warm-up file is landed and published (what a long-lived
process pays once: its Spark session, SSBJ's scan copy of the master). Tuple wait: from a
file's landing to the moment the last of its tuple's rows is seen in the mode's published
table (polled every second, so up to a second late; SSBJ publishes a tuple's matches
partition by partition), p50 / p99 / max over every tuple. Cost: the CPU seconds of the
mode's process tree (Python and its JVM) from the first file's landing to the last row's
publication (a column of its own) and, the cost compared, over the window every mode
shares: from the first landing to the bound after the last landing plus 30 s, by which every
mode must have answered every tuple (a mode done early pays for idling to its end), per
hour of stream. Each mode's published rows must equal DuckDB's join of
the same files as multisets, and the stream's p99 wait must be within the bound, or the
benchmark fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from benchmarks.interval_cost import partsupp_master
from benchmarks.revision import short_commit
from pipeline.freshness import stream_need, stream_trigger

REPO = Path(__file__).resolve().parent.parent
logger = logging.getLogger("stream_cost")
START = datetime(2024, 1, 1)
COLUMNS = ("l_id", "l_partkey", "ps_suppkey", "ps_supplycost")
SETTLE_SECONDS = 30.0
"""The common window's end: the bound after the last landing, plus this."""


@dataclass(frozen=True)
class Shape:
    scale: float
    tuples: int
    every: float
    minutes: float
    bound: float
    trigger: str | None
    partitions: int

    @property
    def stream_trigger(self) -> float:
        """The trigger the stream runs with: given, or derived as ``enrich stream`` does."""
        if self.trigger is not None:
            from common.durations import parse_duration

            return parse_duration(self.trigger).total_seconds()
        need = stream_need("stream", self.partitions, timedelta(seconds=self.bound))
        return stream_trigger([need]).total_seconds()

    @property
    def files(self) -> int:
        return int(self.minutes * 60 / self.every)


@dataclass
class ModeResult:
    mode: str
    seen: dict[int, float] = field(default_factory=dict)  # tuple id -> first seen (monotonic)
    cpu_seconds: float = 0.0  # over the window every mode shares
    window_seconds: float = 0.0
    answer_cpu_seconds: float = 0.0  # to this mode's last answer
    answer_seconds: float = 0.0
    rows: list[tuple[Any, ...]] = field(default_factory=list)


def stream_file(master_parts: np.ndarray, index: int, rows: int) -> pa.Table:
    """``rows`` Zipf(1) tuples over the master's part keys (the same hot keys in every
    file), ids unique across files, event times within the first hour."""
    rng = np.random.default_rng(index)
    weights = 1.0 / np.arange(1, len(master_parts) + 1)
    ranked = np.random.default_rng(7).permutation(master_parts)
    keys = rng.choice(ranked, size=rows, p=weights / weights.sum())
    first = index * rows
    times = [START + timedelta(seconds=index % 3600)] * rows
    return pa.table(
        {
            "l_id": pa.array(np.arange(first, first + rows), pa.int64()),
            "l_partkey": pa.array(keys, pa.int64()),
            "l_quantity": pa.array(rng.integers(1, 51, size=rows).astype(float)),
            "event_time": pa.array(times, pa.timestamp("us")),
        }
    )


def stream_history(
    shape: Shape, parts: np.ndarray, command: list[str], root: Path, sources: Path
) -> None:
    """Run the stream over a history of ``3k + 1`` steps to its end (``--idle-stop``): a
    trigger's worth of tuples a step, one file landed every 3 s under a 3 s trigger, ids
    and keys of their own. What a long-lived stream has been through: its R-cycle machine
    has counted, switched and phased its hot values into H_R."""
    per_step = max(shape.tuples, int(shape.tuples * shape.stream_trigger / shape.every))
    steps = 3 * shape.partitions + 1
    landing = root / "landing"
    landing.mkdir(parents=True, exist_ok=True)
    base = shape.files + 1  # file indexes (and so ids) above the measured and warm-up ones
    history = [*command[:-1], "3s", "--idle-stop", "20"]
    logger.info("stream history: %d steps of %d tuples", steps, per_step)
    with open(root / "history.log", "w") as log:
        process = subprocess.Popen(history, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        for step in range(steps):
            path = sources / f"li-history-{step:05d}.parquet"
            table = stream_file(parts, base * 1000 + step, per_step)
            ids = pa.array(np.arange(per_step) + step * per_step + 10**12, pa.int64())
            pq.write_table(table.set_column(0, "l_id", ids), path)
            os.replace(path, landing / path.name)
            time.sleep(3)
        if process.wait(timeout=1800) != 0:
            raise RuntimeError(f"the stream's history exited {process.returncode}")


def pipeline_config(root: Path, shape: Shape) -> dict[str, Any]:
    return {
        "name": "streambench",
        "warehouse": {"root": str(root / "warehouse"), "engine": "embedded"},
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "4"}},
        "schedule": {"interval": "1h", "start": START.isoformat(), "retries": 0},
        "streams": {
            "li": {
                "landing": str(root / "landing"),
                "format": "parquet",
                "event_time": "event_time",
                "id_column": "l_id",
                "columns": [
                    "l_id bigint not null",
                    "l_partkey bigint",
                    "l_quantity double",
                    "event_time timestamp not null",
                ],
            }
        },
        "masters": {
            "partsupp": {
                "table": "masters/partsupp",
                "keys": ["ps_partkey", "ps_suppkey"],
                "columns": ["ps_partkey", "ps_suppkey", "ps_availqty", "ps_supplycost"],
            }
        },
        "stages": [
            {
                "name": "li_parts",
                "kind": "equi",
                "input": "li",
                "master": "partsupp",
                "join_on": {"l_partkey": "ps_partkey"},
                "join": "inner",
                "output": "li_parts",
                "operator": {"mode": "ssbj", "partitions": shape.partitions},
                "freshness": {"stream_within": f"{int(shape.bound)}s"},
            }
        ],
        "quality": {"li_parts": {"value_ranges": {"l_quantity": [1, 50]}}},
    }


def cpu_of_tree(process: psutil.Process) -> float:
    """User and system CPU seconds of ``process`` and every descendant alive now."""
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def produce(
    shape: Shape, files: list[Path], landings: list[Path], landed: dict[int, float]
) -> None:
    """Place file ``i`` at the start plus ``i * every`` seconds in every landing zone (one
    after the other, a copy each), recording when it landed."""
    for landing in landings:
        landing.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    for index, source in enumerate(files):
        delay = began + index * shape.every - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for landing in landings:
            staging = landing / f"_{source.name}.tmp"
            shutil.copyfile(source, staging)
            os.replace(staging, landing / source.name)
        landed[index] = time.monotonic()


class Watch:
    """Polls a mode's published Delta table every second and records, per tuple id, its
    rows there and when that count last changed: a tuple is answered when its last row is
    published (SSBJ emits a tuple's matches partition by partition)."""

    def __init__(self, table: Path, ids_below: int) -> None:
        self.table = table
        self.ids_below = ids_below
        self.counts: dict[int, int] = {}
        self.changed: dict[int, float] = {}
        self.rows = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from deltalake import DeltaTable

        version = -1
        while not self._stop.is_set():
            if DeltaTable.is_deltatable(str(self.table)):
                dt = DeltaTable(str(self.table))
                if dt.version() != version:
                    version = dt.version()
                    now = time.monotonic()
                    ids = dt.to_pyarrow_table(columns=["l_id"]).column("l_id").to_numpy()
                    ids = ids[ids < self.ids_below]
                    values, counts = np.unique(ids, return_counts=True)
                    for i, c in zip(values.tolist(), counts.tolist(), strict=True):
                        if self.counts.get(i) != c:
                            self.counts[i] = c
                            self.changed[i] = now
                    self.rows = len(ids)
            self._stop.wait(1.0)


@dataclass
class ModeRun:
    """One mode's process through the measured window."""

    mode: str
    process: subprocess.Popen[bytes]
    tree: psutil.Process
    log: Any
    gold: Path
    landing: Path
    result: ModeResult
    watch: Watch | None = None
    cpu_before: float = 0.0

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.process.terminate()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def start_mode(
    mode: str, command: list[str], gold: Path, shape: Shape, warmup: Path, landing: Path
) -> ModeRun:
    """Start the mode's process; land ``warmup`` and wait for its tuples (the session, the
    first steps, SSBJ's scan copy of the master: what a long-lived process pays once)."""
    log = open(landing.parent / f"{mode}.log", "w")  # noqa: SIM115 - closed by ModeRun.stop
    process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    run = ModeRun(mode, process, psutil.Process(process.pid), log, gold, landing, ModeResult(mode))
    try:
        warm = Watch(gold, (shape.files + 1) * shape.tuples).start()
        landing.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(warmup, landing / f"_{warmup.name}.tmp")
        os.replace(landing / f"_{warmup.name}.tmp", landing / warmup.name)
        deadline = time.monotonic() + 600
        while len(warm.counts) < shape.tuples and time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{mode} exited {process.returncode} early; see {log.name}")
            time.sleep(0.5)
        warm.stop()
        if len(warm.counts) < shape.tuples:
            raise RuntimeError(f"{mode}: the warm-up file was not published; see {log.name}")
    except BaseException:
        run.stop()
        raise
    return run


def measure(
    runs: list[ModeRun], shape: Shape, files: list[Path], expected_rows: int
) -> dict[int, float]:
    """The measured window, every mode in it at once: each file lands in every mode's
    landing zone on schedule; a mode's answer time is when every expected row of the
    measured tuples is in its gold. Every mode is charged for the same span, the one within
    which each must answer every tuple: a mode that finishes early idles (and pays for
    idling) to its end. Side by side, a change in the machine's speed during the run
    touches every mode alike (each is idle most of the window)."""
    time.sleep(10)  # past the warm-ups' work
    measured_ids = shape.files * shape.tuples
    for run in runs:
        run.watch = Watch(run.gold, measured_ids).start()
        run.cpu_before = cpu_of_tree(run.tree)
    landed: dict[int, float] = {}
    began = time.monotonic()
    producer = threading.Thread(
        target=produce, args=(shape, files, [r.landing for r in runs], landed), daemon=True
    )
    producer.start()
    deadline = began + shape.minutes * 60 + shape.bound * 3 + 120
    waiting = list(runs)
    while waiting and time.monotonic() < deadline:
        for run in list(waiting):
            assert run.watch is not None
            if run.watch.rows >= expected_rows or run.process.poll() is not None:
                run.result.answer_cpu_seconds = cpu_of_tree(run.tree) - run.cpu_before
                run.result.answer_seconds = time.monotonic() - began
                waiting.remove(run)
        time.sleep(0.5)
    producer.join()
    common_end = began + shape.minutes * 60 + shape.bound + SETTLE_SECONDS
    while time.monotonic() < common_end:
        time.sleep(0.5)
    for run in runs:
        assert run.watch is not None
        run.result.cpu_seconds = cpu_of_tree(run.tree) - run.cpu_before
        run.result.window_seconds = time.monotonic() - began
        run.watch.stop()
        run.result.seen = run.watch.changed
        if run.watch.rows < expected_rows:
            raise RuntimeError(
                f"{run.mode}: {run.watch.rows} of {expected_rows} rows published; see "
                f"{run.log.name}"
            )
    return landed


def published_rows(gold: Path, shape: Shape) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable

    table = DeltaTable(str(gold)).to_pyarrow_table(columns=list(COLUMNS))
    rows = zip(*[table.column(c).to_pylist() for c in COLUMNS], strict=True)
    return sorted(r for r in rows if r[0] < shape.files * shape.tuples)


def oracle_rows(files: list[Path], master: pa.Table) -> list[tuple[Any, ...]]:
    """DuckDB's inner join of every measured file with the master: the rows both modes
    must publish."""
    import duckdb

    con = duckdb.connect()
    con.register("m", master)
    con.register("s", pa.concat_tables([pq.read_table(f) for f in files]))
    found = con.sql(
        "select s.l_id, s.l_partkey, m.ps_suppkey, m.ps_supplycost "
        "from s join m on s.l_partkey = m.ps_partkey"
    ).fetchall()
    return sorted(found)


PLAIN = """
import sys, time, glob, os
from pyspark.sql import SparkSession, functions as F
from warehouse.spark import delta_jars
landing, master, gold, bound = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
spark = (SparkSession.builder.master("local[2]").appName("plain")
    .config("spark.jars", ",".join(delta_jars()))
    .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
    .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
    .config("spark.databricks.delta.snapshotPartitions", "2")
    .config("spark.sql.shuffle.partitions", "4").config("spark.ui.enabled", "false")
    .getOrCreate())
done = set()
while True:
    started = time.monotonic()
    files = sorted(f for f in glob.glob(os.path.join(landing, "*.parquet")) if f not in done)
    if files:
        batch = spark.read.parquet(*files)
        parts = spark.read.format("delta").load(master)
        joined = parts.join(F.broadcast(batch), parts.ps_partkey == batch.l_partkey)
        bad = joined.where((F.col("l_quantity") < 1) | (F.col("l_quantity") > 50)).count()
        assert bad == 0, bad
        joined.write.format("delta").mode("append").save(gold)
        done.update(files)
    time.sleep(max(0.0, bound - (time.monotonic() - started)))
"""


def waits(result: ModeResult, landed: dict[int, float], shape: Shape) -> np.ndarray:
    """Seconds from each tuple's file landing to its first sighting in gold."""
    ids = np.fromiter(result.seen.keys(), dtype=np.int64)
    seen = np.fromiter(result.seen.values(), dtype=float)
    files = ids // shape.tuples
    landed_at = np.array([landed[int(f)] for f in files])
    return np.asarray(seen - landed_at)


def report(shape: Shape, results: list[tuple[ModeResult, np.ndarray]], commit: str) -> list[str]:
    plain = next((r for r, _ in results if r.mode == "plain"), None)
    lines = [
        f"Commit {commit}; {shape.files} files of {shape.tuples:,} Zipf(1) tuples, one every "
        f"{shape.every:g} s for {shape.minutes:g} min, against TPC-H SF{shape.scale:g} "
        f"partsupp; bound {shape.bound:g} s; stream trigger {shape.stream_trigger:g} s"
        f"{' (given)' if shape.trigger else ' (derived: bound / (k + 1))'}, k = "
        f"{shape.partitions}; the stream's history: {3 * shape.partitions + 1} steps.",
        "",
        "| mode | tuple wait p50 / p99 / max (s) | within bound | CPU s to last answer "
        "| CPU s in the common window | CPU s per hour | vs plain |",
        "|---|---|---|---|---|---|---|",
    ]
    for result, wait in results:
        p50, p99, most = np.percentile(wait, [50, 99, 100])
        inside = float((wait <= shape.bound).mean())
        per_hour = result.cpu_seconds / result.window_seconds * 3600
        ratio = "-"
        if plain is not None and plain.cpu_seconds:
            plain_hour = plain.cpu_seconds / plain.window_seconds * 3600
            ratio = f"{per_hour / plain_hour:.2f}x"
        lines.append(
            f"| {result.mode} | {p50:.1f} / {p99:.1f} / {most:.1f} | {inside:.1%} | "
            f"{result.answer_cpu_seconds:.1f} over {result.answer_seconds:.0f} s | "
            f"{result.cpu_seconds:.1f} over {result.window_seconds:.0f} s | {per_hour:.0f} | "
            f"{ratio} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=10.0)
    parser.add_argument("--tuples", type=int, default=1500)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between files")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long files land")
    parser.add_argument("--bound", type=float, default=600.0, help="freshness bound, seconds")
    parser.add_argument(
        "--trigger", default=None, help="the stream's trigger (default: derived from the bound)"
    )
    parser.add_argument("--partitions", type=int, default=8, help="SSBJ's k")
    parser.add_argument("--modes", nargs="+", default=["stream", "plain"])
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "stream_cost")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    shape = Shape(
        args.scale, args.tuples, args.every, args.minutes, args.bound, args.trigger, args.partitions
    )
    master = partsupp_master(shape.scale)(REPO / "var" / "bench" / "interval_cost" / "tpch")
    parts = np.unique(master.column("ps_partkey").to_numpy())
    sources = args.work / "files"
    shutil.rmtree(sources, ignore_errors=True)
    sources.mkdir(parents=True)
    files = []
    for index in range(shape.files):
        path = sources / f"li-{index:05d}.parquet"
        pq.write_table(stream_file(parts, index, shape.tuples), path)
        files.append(path)
    warmup = sources / "li-warmup.parquet"  # ids above the measured files'
    pq.write_table(stream_file(parts, shape.files, shape.tuples), warmup)
    expected = oracle_rows(files, master)
    runs: list[ModeRun] = []
    try:
        for mode in args.modes:
            root = args.work / mode
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True)
            from deltalake import write_deltalake

            master_path = root / "warehouse" / "masters" / "partsupp"
            write_deltalake(
                str(master_path), master, configuration={"delta.enableChangeDataFeed": "true"}
            )
            if mode == "stream":
                config = root / "pipeline.yaml"
                config.write_text(yaml.safe_dump(pipeline_config(root, shape), sort_keys=False))
                command = [
                    sys.executable,
                    "-m",
                    "jobs.enrich",
                    "--config",
                    str(config),
                    "stream",
                    "--trigger",
                    str(shape.trigger),
                ]
                gold = root / "warehouse" / "gold" / "li_parts"
                stream_history(shape, parts, command, root, sources)
                if shape.trigger is None:
                    command = command[:-2]  # derived from the bound
            else:
                gold = root / "gold"
                command = [
                    sys.executable,
                    "-c",
                    PLAIN,
                    str(root / "landing"),
                    str(master_path),
                    str(gold),
                    str(shape.bound),
                ]
            logger.info("mode %s: %s", mode, " ".join(command[:6]))
            runs.append(start_mode(mode, command, gold, shape, warmup, root / "landing"))
        landed = measure(runs, shape, files, len(expected))
    finally:
        for run in runs:
            run.stop()
    results: list[tuple[ModeResult, np.ndarray]] = []
    for run in runs:
        run.result.rows = published_rows(run.gold, shape)
        results.append((run.result, waits(run.result, landed, shape)))
        logger.info("mode %s done: %d tuples", run.mode, len(run.result.seen))
    problems = [
        f"{r.mode} published {len(r.rows)} rows, DuckDB's join {len(expected)}, and they differ"
        for r, _ in results
        if r.rows != expected
    ]
    stream = next((w for r, w in results if r.mode == "stream"), None)
    if stream is not None and np.percentile(stream, 99) > shape.bound:
        problems.append(f"stream: p99 tuple wait over the bound of {shape.bound:g} s")
    lines = report(shape, results, short_commit(REPO) or "unknown")
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    for problem in problems:
        logger.error("%s", problem)
    summary = {r.mode: len(r.seen) for r, _ in results}
    logger.info("published tuples: %s", json.dumps(summary))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
