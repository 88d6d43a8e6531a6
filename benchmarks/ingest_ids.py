"""What loading each id once costs at ingest, as bronze grows.

    python -m benchmarks.ingest_ids [--rows 20000] [--sizes 0 10 40] [--repeats 3]
                                    [--out benchmarks/results/ingest-ids.md]

A stream of ``--rows`` JSON records a file, ids growing with time (as event ids do). For
each bronze size (that many earlier files already loaded), one more file is ingested in
three ways, side by side in one Spark session, each on a fresh copy of the same bronze:

- ``no ids``: the stream declares no id lookup (``StreamSource.id_column`` None), the
  ingest before ``warehouse/record_identity.py``: the plain alternative;
- ``new ids``: the lookup on, a file of ids beyond every loaded one (the usual case: the
  log's min/max statistics rule out every bronze file, nothing of bronze is read);
- ``re-sent``: the lookup on, a file that re-sends the records of one loaded file (one
  file's statistics overlap: that file is read and joined).

Each ingest's seconds are the median of ``--repeats`` runs; the ratio is to ``no ids`` at
the same bronze size. Every run checks what it loaded (new ids: all of them; re-sent: none,
every record counted as re-sent), so a fast wrong answer fails the benchmark.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pyspark.sql import SparkSession

from pipeline.config import ColumnSpec, StreamConfig
from pipeline.runner import stream_source
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.landing import IngestReport, StreamSource, ingest_stream
from warehouse.spark import SparkSettings, build_session
from warehouse.state_store import StateStore

logger = logging.getLogger("ingest_ids")

COLUMNS = [
    ColumnSpec(name="event_id", type="bigint", nullable=False),
    ColumnSpec(name="k", type="bigint"),
    ColumnSpec(name="label", type="string"),
    ColumnSpec(name="ts", type="timestamp", nullable=False),
]
MODES = ("no ids", "new ids", "re-sent")


def write_file(path: Path, first_id: int, rows: int, backwards: bool = False) -> None:
    """``rows`` records from ``first_id``; ``backwards``: the same records in reverse order
    (other bytes, so that the file-level SHA-256 check does not skip a re-send whole)."""
    ids = range(first_id, first_id + rows)
    with path.open("w") as handle:
        for i in reversed(ids) if backwards else ids:
            record = {"event_id": i, "k": i % 1000, "label": f"e{i}", "ts": "2024-01-01T00:00:00"}
            handle.write(json.dumps(record) + "\n")


@dataclass
class Warehouse:
    """One stream's landing directory, bronze, quarantine and ledger under ``root``."""

    root: Path
    source: StreamSource
    store: StateStore

    @classmethod
    def at(cls, root: Path) -> Warehouse:
        landing = root / "landing"
        landing.mkdir(parents=True, exist_ok=True)
        stream = StreamConfig(
            landing=str(landing),
            format="json",
            columns=COLUMNS,
            event_time="ts",
            id_column="event_id",
        )
        source = stream_source("events", stream, str(root / "bronze"), str(root / "quarantine"))
        return cls(root, source, StateStore(f"sqlite:///{root / 'state.db'}"))

    def ingest(self, spark: SparkSession, engine: EmbeddedDeltaEngine, ids: bool) -> IngestReport:
        run_id = f"r{time.monotonic_ns()}"
        self.store.start_run(run_id, "ingest")
        source = self.source if ids else replace(self.source, id_column=None)
        return ingest_stream(spark, engine, self.store, source, run_id)


def build_bronze(spark: SparkSession, folder: Path, files: int, rows: int) -> Path:
    """A warehouse whose bronze holds ``files`` loaded files of ``rows`` ids each."""
    engine = EmbeddedDeltaEngine(spark)
    warehouse = Warehouse.at(folder)
    for index in range(files):
        write_file(warehouse.source.landing_dir / f"f{index:04d}.json", index * rows, rows)
        report = warehouse.ingest(spark, engine, ids=True)
        if report.records_loaded != rows:
            raise RuntimeError(f"building bronze: file {index} loaded {report.records_loaded}")
        if index % 10 == 9:
            logger.info("bronze of %d file(s): %d loaded", files, index + 1)
    warehouse.store.dispose()
    return folder


def one_ingest(
    spark: SparkSession, template: Path, scratch: Path, files: int, rows: int, mode: str
) -> float:
    """Seconds of one ingest of the next file into a copy of ``template``."""
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(template, scratch)
    warehouse = Warehouse.at(scratch)
    # The copy's ledger and bronze name the template's paths: only the new file matters.
    landing = warehouse.source.landing_dir
    for old in landing.glob("f*.json"):
        old.unlink()
    # Re-sent: one loaded file's records again; else the ids after every loaded one.
    first = (files // 2) * rows if mode == "re-sent" and files else files * rows
    write_file(landing / "next.json", first, rows, backwards=mode == "re-sent")
    engine = EmbeddedDeltaEngine(spark)
    started = time.perf_counter()
    report = warehouse.ingest(spark, engine, ids=mode != "no ids")
    seconds = time.perf_counter() - started
    warehouse.store.dispose()
    expected_resent = rows if mode == "re-sent" and files else 0
    if (report.records_resent, report.records_loaded) != (expected_resent, rows - expected_resent):
        raise RuntimeError(
            f"{mode} at {files} file(s): loaded {report.records_loaded}, re-sent "
            f"{report.records_resent}; expected {rows - expected_resent} and {expected_resent}"
        )
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 10, 40])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("warehouse", "pipeline", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    spark = build_session(
        SparkSettings(
            app_name="ingest_ids",
            master="local[2]",
            conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"},
            remote=None,
        )
    )
    folder = Path(tempfile.mkdtemp(prefix="ingest-ids-"))
    results: dict[int, dict[str, float]] = {}
    try:
        for files in args.sizes:
            template = build_bronze(spark, folder / f"bronze-{files}", files, args.rows)
            timings: dict[str, list[float]] = {mode: [] for mode in MODES}
            one_ingest(spark, template, folder / "scratch", files, args.rows, "no ids")  # warm
            for _ in range(args.repeats):
                for mode in MODES:  # interleaved, so drift hits every mode alike
                    timings[mode].append(
                        one_ingest(spark, template, folder / "scratch", files, args.rows, mode)
                    )
            results[files] = {mode: statistics.median(t) for mode, t in timings.items()}
            logger.info("bronze of %d file(s): %s", files, results[files])
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)
    table = render(results, args.rows, args.repeats)
    print(table)
    if args.out:
        args.out.write_text(table)
    return 0


def render(results: dict[int, dict[str, float]], rows: int, repeats: int) -> str:
    lines = [
        f"### Ingest of one {rows:,}-record JSON file against bronze size (median of {repeats})",
        "",
        "| bronze files | bronze rows | no ids s | new ids s | vs no ids | re-sent s | vs no ids |",
        "|---|---|---|---|---|---|---|",
    ]
    for files, by_mode in results.items():
        base = by_mode["no ids"]
        lines.append(
            f"| {files} | {files * rows:,} | {base:.2f} | {by_mode['new ids']:.2f} | "
            f"{by_mode['new ids'] / base:.2f}x | {by_mode['re-sent']:.2f} | "
            f"{by_mode['re-sent'] / base:.2f}x |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
