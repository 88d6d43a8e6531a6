"""``enrich``: the one command line of the pipeline; Airflow tasks call exactly these.

    enrich [--config FILE] ingest                 pick up complete landing files
    enrich [--config FILE] stage NAME             one step of one stage
    enrich [--config FILE] run                    ingest, then one step of every stage
    enrich [--config FILE] validate               audit the run's output batches, then
                                                  publish (or quarantine) them
    enrich [--config FILE] drain                  finish every pending tuple now
    enrich [--config FILE] backfill --start T --end T
    enrich [--config FILE] status [--json]
    enrich [--config FILE] report [--start T --end T] [--out FILE] [--fail-on-unresolved]
    enrich [--config FILE] resolve TABLE --run-id R [--publish]
    enrich [--config FILE] demo-data [--scale S --intervals N --zipf Z]
    enrich [--config FILE] generate-dag --out FILE   (and quality_report_<name>.py beside it)
    enrich [--config FILE] maintain [--retention-hours H]   vacuum every table, keeping
                                                  the versions the pipeline pins
    enrich [--config FILE] spark-server [--host H --port P --log FILE]
                                                  run a Spark Connect server in the
                                                  foreground (spark.remote points at it)

Every command that writes holds the pipeline's lease while it runs (one writer at a time);
``--wait SECONDS`` waits that long for another run's lease.

Exit codes: 0 done; 1 pipeline error; 2 bad configuration or arguments; 3 a quality gate
failed; 4 done, but some landing files were rejected or changed (they stay in place);
5 another run holds the pipeline lease.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_OK,
    EXIT_VALIDATION,
    ConfigError,
    EnrichmentError,
    ValidationFailedError,
)

if TYPE_CHECKING:
    from pipeline.config import PipelineConfig
    from pipeline.context import PipelineContext

logger = logging.getLogger("enrich")

DEFAULT_CONFIG = "configs/demo.yaml"
PACKAGE_LOGGERS = (
    "enrich",
    "common",
    "warehouse",
    "pipeline",
    "joins",
    "cache",
    "quality",
    "reports",
)
READ_ONLY_COMMANDS = ("report",)  # status reads without Spark, before any of this


@dataclass(frozen=True)
class JobArgs:
    """The parsed command line, frozen."""

    command: str
    config: Path
    run_id: str
    start: datetime | None
    end: datetime | None
    stage: str | None
    as_json: bool
    scale: float
    intervals: int
    zipf: float
    out: Path | None
    fail_on_unresolved: bool = False
    publish: bool = False
    retention_hours: float | None = None
    wait_seconds: float = 0.0
    host: str | None = None
    port: int | None = None
    log: Path | None = None


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an ISO-8601 timestamp, got {text!r}") from e
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="enrich", description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=Path(DEFAULT_CONFIG))
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another run's pipeline lease before exiting 5 (default 0)",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("ingest", "run", "validate", "drain", "status", "report"):
        sub = commands.add_parser(name)
        sub.add_argument("--run-id", default=None)
        sub.add_argument("--start", type=_timestamp, default=None, help="data interval start")
        sub.add_argument("--end", type=_timestamp, default=None, help="data interval end")
        if name == "status":
            sub.add_argument("--json", action="store_true")
        if name == "report":
            sub.add_argument("--out", type=Path, default=None)
            sub.add_argument(
                "--fail-on-unresolved",
                action="store_true",
                help="exit 3 if a run in the range has a quarantined batch nobody resolved",
            )
    resolve = commands.add_parser("resolve", help="close a quarantined output batch")
    resolve.add_argument("name", metavar="TABLE")
    resolve.add_argument("--run-id", required=True)
    resolve.add_argument(
        "--publish", action="store_true", help="publish the quarantined rows as they are"
    )
    stage = commands.add_parser("stage")
    stage.add_argument("name")
    stage.add_argument("--run-id", default=None)
    stage.add_argument("--start", type=_timestamp, default=None)
    stage.add_argument("--end", type=_timestamp, default=None)
    backfill = commands.add_parser("backfill")
    backfill.add_argument("--start", type=_timestamp, required=True)
    backfill.add_argument("--end", type=_timestamp, required=True)
    backfill.add_argument("--run-id", default=None)
    demo = commands.add_parser("demo-data")
    demo.add_argument("--scale", type=float, default=0.01)
    demo.add_argument("--intervals", type=int, default=3)
    demo.add_argument("--zipf", type=float, default=0.0)
    demo.add_argument("--start", type=_timestamp, default=None, help="first interval start")
    generate = commands.add_parser("generate-dag")
    generate.add_argument("--out", type=Path, required=True)
    maintain = commands.add_parser(
        "maintain", help="vacuum every Delta table of the pipeline, keeping pinned versions"
    )
    maintain.add_argument("--run-id", default=None)
    maintain.add_argument(
        "--retention-hours",
        type=float,
        default=None,
        help="override warehouse.vacuum_retention_hours for this run",
    )
    server = commands.add_parser(
        "spark-server",
        help="run a Spark Connect server in the foreground for commands with spark.remote",
    )
    server.add_argument("--host", default=None, help="default: spark.remote's, else 127.0.0.1")
    server.add_argument(
        "--port", type=int, default=None, help="default: spark.remote's, else 15002"
    )
    server.add_argument("--log", type=Path, default=None, help="the server's log file")
    return parser


def parse_args(argv: Sequence[str]) -> tuple[JobArgs, str]:
    ns = build_parser().parse_args(list(argv))
    if ns.wait < 0:
        raise ConfigError(f"--wait must be >= 0 seconds, got {ns.wait}")
    if ns.command == "backfill" and ns.start >= ns.end:
        raise ConfigError(f"backfill: --start {ns.start} must be before --end {ns.end}")
    run_id = getattr(ns, "run_id", None) or f"{ns.command}__{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    args = JobArgs(
        command=ns.command,
        config=ns.config,
        run_id=run_id,
        start=getattr(ns, "start", None),
        end=getattr(ns, "end", None),
        stage=getattr(ns, "name", None),
        as_json=getattr(ns, "json", False),
        scale=getattr(ns, "scale", 0.01),
        intervals=getattr(ns, "intervals", 3),
        zipf=getattr(ns, "zipf", 0.0),
        out=getattr(ns, "out", None),
        fail_on_unresolved=getattr(ns, "fail_on_unresolved", False),
        publish=getattr(ns, "publish", False),
        retention_hours=getattr(ns, "retention_hours", None),
        wait_seconds=ns.wait,
        host=getattr(ns, "host", None),
        port=getattr(ns, "port", None),
        log=getattr(ns, "log", None),
    )
    return args, ns.log_level


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, level = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    # Inside Airflow the root logger is already configured and must stay so (task logs).
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from common.secrets import install_secret_filter

    install_secret_filter(logging.getLogger().handlers)  # URL passwords, ${VAR} secrets
    for name in PACKAGE_LOGGERS:
        logging.getLogger(name).setLevel(level.upper())
    try:
        return _dispatch(args)
    except ValidationFailedError as e:
        logger.error("%s", e)
        return EXIT_VALIDATION
    except ConfigError as e:
        logger.error("configuration error: %s", e)
        return EXIT_CONFIG
    except EnrichmentError as e:
        logger.error("%s: %s", type(e).__name__, e)
        return e.exit_code


def _dispatch(args: JobArgs) -> int:
    from pipeline.config import load_config

    config = load_config(
        args.config,
        None
        if args.retention_hours is None
        else {"warehouse.vacuum_retention_hours": args.retention_hours},
    )
    if args.command == "generate-dag":
        from pipeline.dag_generator import write_dag

        assert args.out is not None
        for path in write_dag(config, args.config, args.out):
            print(f"wrote {path}")
        return EXIT_OK

    if args.command == "spark-server":
        return _serve_spark(config, args)
    if args.command == "status":
        from pipeline.status import pipeline_status
        from warehouse.state_store import StateStore

        store = StateStore(config.warehouse.resolved_state_store())
        try:
            status = pipeline_status(config, store)
        finally:
            store.dispose()
        print(json.dumps(status, indent=2, default=str) if args.as_json else _format_status(status))
        return EXIT_OK
    if args.stage is not None and args.command == "stage":
        config.stage(args.stage)  # an unknown stage is a config error before Spark starts

    from pipeline.context import open_pipeline

    with open_pipeline(config) as pipeline:
        if args.command in READ_ONLY_COMMANDS:
            return _dispatch_read_only(pipeline, args)
        with pipeline.exclusive(f"{args.command} {args.run_id}", args.wait_seconds):
            return _dispatch_writer(pipeline, args)


def _dispatch_read_only(pipeline: PipelineContext, args: JobArgs) -> int:
    """Commands that only read: they never wait for, or take, the pipeline lease."""
    from pipeline.run_report import write_run_report

    report = write_run_report(pipeline, args.start, args.end, args.out)
    print(f"report: {report.path} ({report.runs} run(s))")
    if args.fail_on_unresolved and report.unresolved:
        raise ValidationFailedError(
            f"{len(report.unresolved)} unresolved quarantined batch(es) in the range: "
            + "; ".join(f"{u['table']} from run {u['run_id']}" for u in report.unresolved)
            + " (close them with `enrich resolve TABLE --run-id R [--publish]`)"
        )
    return EXIT_OK


def _dispatch_writer(pipeline: PipelineContext, args: JobArgs) -> int:
    """Commands that write; the caller holds the pipeline lease."""
    if args.command == "demo-data":
        from demo.prepare import prepare_demo

        prepare_demo(pipeline, args.scale, args.intervals, args.zipf, args.start)
        return EXIT_OK
    if args.command == "resolve":
        assert args.stage is not None
        published = pipeline.auditor.resolve(args.stage, args.run_id, args.publish)
        print(f"resolved {args.stage} of run {args.run_id}; {published} row(s) published")
        return EXIT_OK
    if args.command == "maintain":
        return pipeline.execute(args.command, args.run_id, echo=print)
    return pipeline.execute(args.command, args.run_id, args.start, args.end, args.stage)


def _serve_spark(config: PipelineConfig, args: JobArgs) -> int:
    """Run a Spark Connect server with the config's master and settings until stopped."""
    from warehouse.connect_address import DEFAULT_HOST, DEFAULT_PORT, RemoteAddress, parse_remote
    from warehouse.connect_server import ConnectServer, ConnectServerSettings
    from warehouse.spark import effective_remote

    remote = effective_remote(config.spark.remote)  # where the clients will look
    try:
        configured = parse_remote(remote) if remote else RemoteAddress(DEFAULT_HOST, DEFAULT_PORT)
    except ValueError as e:
        raise ConfigError(f"SPARK_REMOTE: {e}") from e
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError(f"--port must be a TCP port (1-65535), got {args.port}")
    address = RemoteAddress(args.host or configured.host, args.port or configured.port)
    settings = ConnectServerSettings(
        address=address,
        master=config.spark.master,
        conf=config.spark.conf,
        app_name=f"enrich-{config.name}-connect",
        log_file=args.log,
    )

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if address.host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "Spark Connect has no authentication of its own: anyone who can reach %s:%d can "
            "run code as this user; keep it on a private network",
            address.host,
            address.port,
        )
    signal.signal(signal.SIGTERM, stop)
    with ConnectServer(settings) as server:
        print(f"Spark Connect server at {server.url} (log {server.log_path}); Ctrl-C stops it")
        print(f"point commands at it: `spark.remote: {server.url}` or SPARK_REMOTE={server.url}")
        try:
            code = server.wait()
        except KeyboardInterrupt:
            return EXIT_OK
    logger.error(
        "expected the Spark Connect server to run until stopped; it exited with code %s, "
        "and its log %s ends with:\n%s",
        code,
        server.log_path,
        server.log_tail(),
    )
    return EXIT_ERROR


def _format_status(status: dict[str, object]) -> str:
    lines = ["streams:"]
    for name, info in status["streams"].items():  # type: ignore[attr-defined]
        lines.append(f"  {name}: {info}")
    lines.append("stages:")
    for name, info in status["stages"].items():  # type: ignore[attr-defined]
        lines.append(f"  {name}: {info}")
    lines.append("last runs:")
    for run in status["last_runs"]:  # type: ignore[attr-defined]
        lines.append(f"  {run}")
    return "\n".join(lines)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
