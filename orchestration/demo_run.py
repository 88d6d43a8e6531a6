"""``make demo``: the Airflow DAG over generated demo data, for several intervals.

1. Resets ``var/demo`` and ``var/airflow`` (the demo owns both).
2. Generates TPC-H masters and stream files (``enrich demo-data``).
3. For each interval: delivers that interval's files into the landing zone, then runs the
   ``enrich_demo`` DAG for it with ``dag.test()`` against a SQLite metadata DB.
4. Runs the daily ``quality_report_demo`` DAG for the day of those intervals.
5. Prints where the staged and published outputs, the run report and the Data Docs are.

With ``--object-store`` (``make demo-s3``) the warehouse and the landing zones are in an
S3-compatible object store: a SeaweedFS server started on loopback for the demo's duration
(:mod:`warehouse.object_store_server`), bucket ``demo``; the config's
``ENRICH_DEMO_WAREHOUSE`` and ``ENRICH_DEMO_LANDING`` point there, the ``AWS_*`` variables
carry its endpoint and keys, and the driver's own files stay in ``var/demo``.

Usage: python -m orchestration.demo_run [--intervals N] [--scale SF] [--zipf Z] [--object-store]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common.command_logging import configure_command_logging
from orchestration.airflow_env import REPO_ROOT, prepare_airflow_home

CONFIG = REPO_ROOT / "configs" / "demo.yaml"
DAG_ID = "enrich_demo"
REPORT_DAG_ID = "quality_report_demo"
DEMO_BUCKET = "demo"

logger = logging.getLogger("demo")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--zipf", type=float, default=0.0)
    parser.add_argument(
        "--object-store",
        action="store_true",
        help="the warehouse and landing zones in a local S3 server (SeaweedFS) started for it",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    configure_command_logging("INFO", ("demo",))
    started = time.monotonic()
    var = REPO_ROOT / "var"
    from jobs.worker import stop_worker

    stop_worker(CONFIG)  # one left by an interrupted demo would outlive the tables it knew
    for folder in (var / "demo", var / "airflow"):
        shutil.rmtree(folder, ignore_errors=True)
    prepare_airflow_home(var / "airflow")

    with ExitStack() as stack:
        if args.object_store:
            stack.enter_context(_object_store())
        # The DAG's tasks ran in the pipeline's warm worker; a demo leaves none behind.
        stack.callback(stop_worker, CONFIG)
        code = _run(args, started)
    return code


@contextmanager
def _object_store() -> Iterator[None]:
    """A SeaweedFS server on loopback with the bucket ``demo``, and the environment that
    points the demo config and every library at it, for the block's duration."""
    from warehouse.object_store_server import started_s3_server

    server = started_s3_server()
    saved = dict(os.environ)
    try:
        server.client().create_bucket(Bucket=DEMO_BUCKET)
        os.environ.update(server.environment())
        os.environ["ENRICH_DEMO_WAREHOUSE"] = f"s3://{DEMO_BUCKET}/warehouse"
        os.environ["ENRICH_DEMO_LANDING"] = f"s3://{DEMO_BUCKET}/landing"
        logger.info("object store: SeaweedFS at %s, bucket %s", server.endpoint, DEMO_BUCKET)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        server.stop()


def _run(args: argparse.Namespace, started: float) -> int:
    from jobs.enrich import main as enrich

    # The data is generated in the warm worker the DAG's tasks then use: this process
    # starts no Spark of its own.
    base = ["--config", str(CONFIG), "--worker"]
    demo_args = ["demo-data", "--scale", str(args.scale), "--intervals", str(args.intervals)]
    if enrich([*base, *demo_args, "--zipf", str(args.zipf)]) != 0:
        return 1

    from airflow.dag_processing.dagbag import DagBag

    configure_command_logging("INFO", ("demo",))  # Airflow replaced the root handler

    from demo.data import deliver
    from demo.prepare import demo_folder
    from pipeline.config import load_config

    config = load_config(CONFIG)
    outbox = demo_folder(config) / "outbox"
    manifest = json.loads((outbox / "manifest.json").read_text())
    bag = DagBag(dag_folder=str(REPO_ROOT / "dags"))
    dag, report_dag = bag.get_dag(DAG_ID), bag.get_dag(REPORT_DAG_ID)
    if dag is None or report_dag is None:
        print(f"error: DAGs did not load from {REPO_ROOT / 'dags'}", file=sys.stderr)
        return 1
    step = timedelta(seconds=manifest["interval_seconds"])
    for index, start_text in enumerate(manifest["intervals"]):
        for stream in manifest["streams"]:
            deliver(outbox, stream, index, config.streams[stream].landing)
        end = datetime.fromisoformat(start_text).replace(tzinfo=UTC) + step
        logger.info(
            "DAG run %d/%d for interval ending %s", index + 1, len(manifest["intervals"]), end
        )
        if not _succeeded(dag.test(logical_date=end), end):
            return 1
    day_end = datetime.combine(end.date() + timedelta(days=1), datetime.min.time(), UTC)
    logger.info("quality report DAG for the day ending %s", day_end)
    if not _succeeded(report_dag.test(logical_date=day_end), day_end):
        return 1

    from deltalake import DeltaTable

    from pipeline.layout import WarehouseLayout
    from warehouse.object_store import storage_options

    layout = WarehouseLayout.of(config)
    print("\nEnriched outputs (Delta tables): staged by the operators, published after audit")
    for stage in config.stages:
        for kind, path in (
            ("staged", layout.staged(stage.output)),
            ("published", layout.published(stage.output)),
        ):
            table = DeltaTable(path, storage_options=storage_options(path))
            print(
                f"  {stage.output:<20} {kind:<9} {table.count():>8} rows  "
                f"v{table.version():<3} {path}"
            )
    reports = sorted(Path(layout.reports()).glob("*.html"))
    docs = Path(layout.gx_project()) / "gx/uncommitted/data_docs/local_site/index.html"
    print(f"Run report:  {reports[-1] if reports else 'not written'}")
    print(f"Data Docs:   {docs}")
    print(f"State store: {config.warehouse.resolved_state_store()}")
    print(f"Status:      {sys.executable} -m jobs.enrich --config {CONFIG} status")
    print(f"Done in {time.monotonic() - started:.0f}s")
    return 0


def _succeeded(run: object, logical_date: datetime) -> bool:
    state = str(getattr(run, "state", None))
    if state in ("success", "DagRunState.SUCCESS"):
        return True
    print(f"error: DAG run for {logical_date} ended {state}", file=sys.stderr)
    return False


if __name__ == "__main__":
    sys.exit(main())
