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

import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
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
from jobs.worker_request import WorkerRequest, worker_request

if TYPE_CHECKING:
    from jobs.cli import JobArgs
    from pipeline.config import PipelineConfig
    from pipeline.context import PipelineContext
    from warehouse.state_store import StateStore

logger = logging.getLogger("enrich")

T = TypeVar("T")

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


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    request = worker_request(raw)
    if request is not None:  # a task of the DAG: the worker parses it
        return _guarded(lambda: _send_to_worker(request))
    from jobs.cli import parse_args

    try:
        args, level = parse_args(raw)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except SystemExit as e:  # argparse: --help and --version (0), a bad argument (2)
        return e.code if isinstance(e.code, int) else EXIT_CONFIG
    from common.command_logging import configure_command_logging

    # Inside Airflow the root handler filters at Airflow's own level: lowered to ours.
    configure_command_logging(level, PACKAGE_LOGGERS)
    if args.via_worker:  # in a form the request reader leaves to the parser
        from jobs.worker import run_in_worker

        raw.remove("--worker")
        return _guarded(lambda: run_in_worker(raw, args.config, args.master))
    return _guarded(lambda: _dispatch(args))


def _send_to_worker(request: WorkerRequest) -> int:
    """A DAG task's command line, read by :func:`jobs.worker_request.worker_request`, run
    in the worker, which parses it and reports its errors."""
    from common.command_logging import configure_command_logging
    from jobs.worker import run_in_worker

    # Inside Airflow the root handler filters at Airflow's own level: lowered to ours.
    configure_command_logging(request.log_level, PACKAGE_LOGGERS)
    return run_in_worker(request.argv, request.config, request.master)


def _guarded(command: Callable[[], int]) -> int:
    """``command``'s exit code, the domain errors it raises logged and mapped to theirs."""
    try:
        return command()
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
        from pipeline.stream_service import with_stream_memory, with_stream_session
        from warehouse.spark import effective_remote

        config = with_stream_session(
            with_stream_memory(config), effective_remote(config.spark.remote)
        )
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
