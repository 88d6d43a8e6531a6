"""``enrich``: the one command line of the pipeline; Airflow tasks call exactly these.

    enrich [--config FILE] ingest                 pick up complete landing files
    enrich [--config FILE] stage NAME             one step of one stage
    enrich [--config FILE] run                    ingest, then one step of every stage
    enrich [--config FILE] validate               audit the run's output batches, then
                                                  publish (or quarantine) them
    enrich [--config FILE] drain                  finish every pending tuple now
    enrich [--config FILE] backfill --start T --end T
    enrich [--config FILE] status [--json]        offsets, lag, landing files, last runs
    enrich [--config FILE] plan STAGE             the cost models' recommendation
    enrich [--config FILE] report [--start T --end T] [--out FILE] [--fail-on-unresolved]
    enrich [--config FILE] resolve TABLE --run-id R [--publish]
    enrich [--config FILE] demo-data [--scale S --intervals N --zipf Z]
    enrich [--config FILE] generate-dag --out FILE   (and quality_report_<name>.py beside it)
    enrich [--config FILE] maintain [--retention-hours H]   compact, then vacuum every
                                                  table, keeping the versions it pins
    enrich [--config FILE] spark-server [--host H --port P --log FILE]
                                                  run a Spark Connect server in the
                                                  foreground (spark.remote points at it)
    enrich [--config FILE] worker [--idle-timeout S --max-commands N | --stop]
                                                  run the pipeline's warm worker in the
                                                  foreground, or stop the running one
    enrich [--config FILE] --worker COMMAND ...   run COMMAND in the warm worker (started
                                                  if none runs); the DAG's tasks do this

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

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
    from warehouse.state_store import StateStore

logger = logging.getLogger("enrich")

T = TypeVar("T")

DEFAULT_CONFIG = "configs/demo.yaml"
DISTRIBUTION = "stream-enrichment"
PACKAGE_LOGGERS = (
    "enrich",
    "jobs",
    "common",
    "warehouse",
    "pipeline",
    "joins",
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
    master: str | None = None
    host: str | None = None
    port: int | None = None
    log: Path | None = None
    steps: int | None = None
    drain: bool = False
    via_worker: bool = False
    socket: Path | None = None
    idle_timeout: float | None = None
    max_commands: int | None = None
    stop: bool = False
    trigger: str | None = None
    idle_stop: float | None = None
    max_seconds: float | None = None


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from e
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _timestamp(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected an ISO-8601 timestamp, got {text!r}") from e
    return value if value.tzinfo else value.replace(tzinfo=UTC)


DESCRIPTION = """\
Enrich stream micro-batches with Delta Lake master tables: equi joins through SSBJ (a hot
cache plus a MESHJOIN cyclic scan), theta joins (band, range, inequality) through A-DSP,
every output audited by Great Expectations before it is published.

Airflow runs `ingest`, one `stage NAME` per stage, then `validate`; every command that
writes holds the pipeline's lease (one writer at a time)."""

EPILOG = """\
exit codes: 0 done; 1 pipeline error; 2 bad configuration or arguments; 3 a quality gate
failed; 4 done, but some landing files were rejected or changed (they stay in place);
5 another run holds the pipeline lease.

`enrich COMMAND --help` describes one command."""

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    from rich_argparse import RawDescriptionRichHelpFormatter

    formatter = RawDescriptionRichHelpFormatter
    parser = argparse.ArgumentParser(
        prog="enrich", description=DESCRIPTION, epilog=EPILOG, formatter_class=formatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(DEFAULT_CONFIG),
        metavar="FILE",
        help=f"the pipeline's YAML config (default {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        metavar="LEVEL",
        help=f"log level of the pipeline's own loggers: {', '.join(LOG_LEVELS)} (default INFO)",
    )
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="the Spark master (spark://host:7077, local[4], ...); beats SPARK_MASTER and "
        "the config's spark.master (default: those, else local[2])",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another run's pipeline lease before exiting 5 (default 0)",
    )
    parser.add_argument(
        "--worker",
        action="store_true",
        help="run the command in the pipeline's warm worker process, starting one if none "
        "runs: Python, Spark and Great Expectations are paid once, not per command "
        "(how the DAG's tasks run when schedule.worker.enabled)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=summary + (f"\n\n{details}" if details else ""),
            formatter_class=formatter,
        )

    def run_id(sub: argparse.ArgumentParser, required: bool = False) -> None:
        sub.add_argument(
            "--run-id",
            required=required,
            default=None,
            metavar="ID",
            help="the run this command belongs to (Airflow passes its run id; default: "
            "the command and the current time)",
        )

    def interval(sub: argparse.ArgumentParser, what: str, required: bool = False) -> None:
        sub.add_argument(
            "--start",
            type=_timestamp,
            required=required,
            default=None,
            metavar="T",
            help=f"{what} start, ISO-8601 (UTC unless it has an offset)",
        )
        sub.add_argument(
            "--end",
            type=_timestamp,
            required=required,
            default=None,
            metavar="T",
            help=f"{what} end, exclusive, ISO-8601",
        )

    scheduled = {
        "ingest": ("pick up complete landing files into the bronze tables", ""),
        "run": ("ingest, then one step of every stage, in config order", ""),
        "validate": (
            "audit each output's new batch, then publish it or quarantine it",
            "Runs the output's Great Expectations suites and the row-conservation checks; "
            "exits 3 if a batch was quarantined.",
        ),
        "drain": ("join every pending tuple now; nothing stays pending afterwards", ""),
    }
    for name, (summary, details) in scheduled.items():
        sub = command(name, summary, details)
        run_id(sub)
        interval(sub, "data interval")
    stage = command(
        "stage",
        "one step of one stage",
        "SSBJ stages take their scheduled steps (`operator.steps_per_run`, or the fewest "
        "that keep `freshness.complete_within`), then the steps that answer every tuple the "
        "bound makes due; other stages join what arrived since their last step.",
    )
    stage.add_argument("name", metavar="NAME", help="the stage's name in the config")
    stage.add_argument(
        "--steps",
        type=_at_least_one,
        default=None,
        metavar="N",
        help="SSBJ operator steps this run before its closing steps (default: the scheduled "
        "steps; other stages take one step, which joins everything that arrived)",
    )
    stage.add_argument(
        "--drain", action="store_true", help="then join every pending tuple of the stage"
    )
    run_id(stage)
    interval(stage, "data interval")
    backfill = command(
        "backfill",
        "re-join an interval against the masters as of its end and replace it",
        "The replaced interval is audited before it is published; live state is not disturbed.",
    )
    interval(backfill, "interval", required=True)
    run_id(backfill)
    status = command("status", "offsets, lag, landing files and the last runs (no Spark)")
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    plan = command(
        "plan",
        "what the cost models recommend for a stage, from its recorded steps (no Spark)",
        "SSBJ stages: Eq. 2 fitted to the measured steps, then k, steps per run and memory "
        "(Eq. 1, 3-5). Theta stages: the configured scheme, the one chosen last, and the kept "
        "A-DSP layout.",
    )
    plan.add_argument("name", metavar="STAGE", help="the stage's name in the config")
    report = command("report", "write the HTML run report of a range of runs")
    interval(report, "report range")
    report.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="the report file (default: _reports/ under warehouse.local_root)",
    )
    report.add_argument(
        "--fail-on-unresolved",
        action="store_true",
        help="exit 3 if a run in the range has a quarantined batch nobody resolved",
    )
    resolve = command(
        "resolve",
        "close a quarantined output batch",
        "Without --publish the batch stays out of the published table; with it, its rows "
        "are published as they are.",
    )
    resolve.add_argument("name", metavar="TABLE", help="the output table")
    run_id(resolve, required=True)
    resolve.add_argument(
        "--publish", action="store_true", help="publish the quarantined rows as they are"
    )
    demo = command("demo-data", "generate TPC-H masters and Zipf stream files for the demo config")
    demo.add_argument(
        "--scale", type=float, default=0.01, metavar="SF", help="TPC-H scale factor (0.01)"
    )
    demo.add_argument(
        "--intervals",
        type=int,
        default=3,
        metavar="N",
        help="hourly stream intervals to write (3)",
    )
    demo.add_argument(
        "--zipf", type=float, default=0.0, metavar="Z", help="Zipf skew of stream keys (0)"
    )
    demo.add_argument(
        "--start", type=_timestamp, default=None, metavar="T", help="first interval start"
    )
    generate = command(
        "generate-dag",
        "write the config's Airflow DAG file (and quality_report_<name>.py beside it)",
    )
    generate.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="the DAG file to write"
    )
    maintain = command(
        "maintain",
        "compact, then vacuum every Delta table of the pipeline, keeping the versions it pins",
    )
    run_id(maintain)
    maintain.add_argument(
        "--retention-hours",
        type=float,
        default=None,
        metavar="H",
        help="override warehouse.vacuum_retention_hours for this run",
    )
    server = command(
        "spark-server",
        "run a Spark Connect server in the foreground for commands with spark.remote",
    )
    server.add_argument("--host", default=None, help="default: spark.remote's host, else 127.0.0.1")
    server.add_argument(
        "--port", type=int, default=None, help="default: spark.remote's port, else 15002"
    )
    server.add_argument(
        "--log", type=Path, default=None, metavar="FILE", help="the server's log file"
    )
    worker = command(
        "worker",
        "run the pipeline's warm worker in the foreground (or stop the running one)",
        "Commands sent with `enrich --worker COMMAND` (and the DAG's tasks) run in this "
        "process, one at a time; it exits after schedule.worker.idle_timeout without a "
        "command or schedule.worker.max_commands commands. `--worker` starts one on demand.",
    )
    worker.add_argument(
        "--socket",
        type=Path,
        default=None,
        metavar="PATH",
        help="listen here (default: "
        "the path clients of this config, master and environment look at)",
    )
    worker.add_argument(
        "--idle-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="default schedule.worker.idle_timeout",
    )
    worker.add_argument(
        "--max-commands",
        type=_at_least_one,
        default=None,
        metavar="N",
        help="default schedule.worker.max_commands",
    )
    worker.add_argument(
        "--stop", action="store_true", help="stop the running worker of this config"
    )
    stream = command(
        "stream",
        "the continuous mode: ingest, step and publish as files land, until stopped",
        "Structured Streaming queries watch the landing zones (and a clock keeps SSBJ's "
        "cycle moving while the input pauses); every micro-batch ingests what landed, takes "
        "one step of every stage and publishes what was staged, under the pipeline lease. "
        "Scheduled runs still close their intervals. Ctrl-C or SIGTERM stops it after the "
        "micro-batch under way; started again, it resumes where it stopped.",
    )
    stream.add_argument(
        "--trigger",
        default=None,
        metavar="DURATION",
        help="a micro-batch at most this often (5s, 1m); default: the longest that keeps "
        "every stage's freshness.stream_within (SSBJ: bound / (k + 2))",
    )
    stream.add_argument(
        "--idle-stop",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop once nothing landed and nothing was pending for this long",
    )
    stream.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop after this long",
    )
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
        master=ns.master,
        host=getattr(ns, "host", None),
        port=getattr(ns, "port", None),
        log=getattr(ns, "log", None),
        steps=getattr(ns, "steps", None),
        drain=getattr(ns, "drain", False),
        via_worker=ns.worker,
        socket=getattr(ns, "socket", None),
        idle_timeout=getattr(ns, "idle_timeout", None),
        max_commands=getattr(ns, "max_commands", None),
        stop=getattr(ns, "stop", False),
        trigger=getattr(ns, "trigger", None),
        idle_stop=getattr(ns, "idle_stop", None),
        max_seconds=getattr(ns, "max_seconds", None),
    )
    if args.via_worker and args.command in ("worker", "spark-server", "stream"):
        raise ConfigError(f"--worker runs pipeline commands; `{args.command}` runs on its own")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        raise ConfigError(f"--idle-timeout must be > 0 seconds, got {args.idle_timeout}")
    return args, ns.log_level


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args, level = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except SystemExit as e:  # argparse: --help and --version (0), a bad argument (2)
        return e.code if isinstance(e.code, int) else EXIT_CONFIG
    from common.command_logging import configure_command_logging

    # Inside Airflow the root handler filters at Airflow's own level: lowered to ours.
    configure_command_logging(level, PACKAGE_LOGGERS)
    try:
        if args.via_worker:
            from jobs.worker import run_in_worker

            raw = list(sys.argv[1:] if argv is None else argv)
            raw.remove("--worker")
            return run_in_worker(raw, args.config, args.master)
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
    if args.command == "worker":
        return _serve_worker(config, args)
    if args.command == "status":
        from pipeline.status import pipeline_status

        status = _read_store(config, lambda store: pipeline_status(config, store))
        if args.as_json:
            print(json.dumps(status, indent=2, default=str))
        else:
            from jobs.status_view import print_status

            print_status(status)
        return EXIT_OK
    if args.command == "plan":
        from pipeline.stage_plan import describe, plan_stage

        stage_name = args.stage
        assert stage_name is not None
        plan = _read_store(config, lambda store: plan_stage(config, store, stage_name))
        print("\n".join(describe(plan)))
        return EXIT_OK
    if args.stage is not None and args.command == "stage":
        config.stage(args.stage)  # an unknown stage is a config error before Spark starts

    from pipeline.context import open_pipeline

    if args.command == "stream":
        from pipeline.stream_service import with_stream_memory

        config = with_stream_memory(config)
    with open_pipeline(config, master=args.master) as pipeline:
        if args.command == "stream":
            return _serve_stream(pipeline, args)
        if args.command in READ_ONLY_COMMANDS:
            return _dispatch_read_only(pipeline, args)
        with pipeline.exclusive(f"{args.command} {args.run_id}", args.wait_seconds):
            return _dispatch_writer(pipeline, args)


def _read_store(config: PipelineConfig, read: Callable[[StateStore], T]) -> T:
    """``read`` over the config's state store, closed afterwards; no Spark is started."""
    from warehouse.state_store import StateStore

    store = StateStore(config.warehouse.resolved_state_store())
    try:
        return read(store)
    finally:
        store.dispose()


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
    return pipeline.execute(
        args.command,
        args.run_id,
        args.start,
        args.end,
        args.stage,
        steps=args.steps,
        drain=args.drain,
    )


def _serve_stream(pipeline: PipelineContext, args: JobArgs) -> int:
    """Run the continuous mode until a stop condition, Ctrl-C or SIGTERM."""
    from common.durations import parse_duration
    from pipeline.stream_service import StreamService, StreamSettings, resolve_trigger

    asked = None
    if args.trigger is not None:
        try:
            asked = parse_duration(args.trigger)
        except ValueError as e:
            raise ConfigError(f"--trigger: {e}") from e
    trigger = resolve_trigger(pipeline.config, asked).total_seconds()
    for flag, value in (("--idle-stop", args.idle_stop), ("--max-seconds", args.max_seconds)):
        if value is not None and value <= 0:
            raise ConfigError(f"{flag}: expected a number of seconds > 0, got {value}")
    service = StreamService(
        pipeline,
        StreamSettings(
            trigger_seconds=trigger,
            idle_stop_seconds=args.idle_stop,
            max_seconds=args.max_seconds,
        ),
    )

    def stop(signum: int, frame: object) -> None:
        logger.info("stream: signal %d, stopping after the micro-batch under way", signum)
        service.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stats = service.run()
    print(
        f"stream stopped: {stats.micro_batches} micro-batch(es), "
        f"{stats.ticks_skipped} idle clock tick(s)"
    )
    return EXIT_OK


def _serve_spark(config: PipelineConfig, args: JobArgs) -> int:
    """Run a Spark Connect server with the config's master and settings until stopped."""
    from warehouse.connect_address import DEFAULT_HOST, DEFAULT_PORT, RemoteAddress, parse_remote
    from warehouse.connect_server import ConnectServer, ConnectServerSettings
    from warehouse.spark import effective_master, effective_remote

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
        master=effective_master(args.master, config.spark.master),
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


def _serve_worker(config: PipelineConfig, args: JobArgs) -> int:
    """Run the pipeline's warm worker until a limit ends it, or stop the running one."""
    from jobs.worker import WorkerLimits, serve, spark_driver_alive, stop_worker, worker_socket

    if args.stop:
        stopped = stop_worker(args.config, args.master)
        print("worker stopped" if stopped else "no worker was running")
        return EXIT_OK
    limits = WorkerLimits(
        idle_timeout_seconds=args.idle_timeout or config.schedule.worker.idle_timeout_seconds,
        max_commands=args.max_commands or config.schedule.worker.max_commands,
    )
    socket_path = args.socket or worker_socket(args.config, args.master)
    return serve(socket_path, limits, main, spark_driver_alive)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
