"""The ``enrich`` command line: its parser (one declaration per subcommand group) and the
frozen arguments it parses to; ``jobs.enrich`` dispatches them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from common.errors import ConfigError
from jobs.worker_request import DEFAULT_CONFIG, LOG_LEVELS

DISTRIBUTION = "stream-enrichment"


@dataclass(frozen=True)
class JobArgs:
    """The parsed command line, frozen."""

    command: str
    config: Path
    run_id: str
    start: datetime | None = None
    end: datetime | None = None
    stage: str | None = None
    as_json: bool = False
    scale: float = 0.01
    intervals: int = 3
    zipf: float = 0.0
    out: Path | None = None
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


# The JobArgs fields whose option (argparse's ``dest``) has another name; a field whose
# option the command lacks keeps its default.
OPTION_OF = {"stage": "name", "as_json": "json", "wait_seconds": "wait", "via_worker": "worker"}


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
    commands = Commands(
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND"), formatter
    )
    _scheduled_commands(commands)
    _inspection_commands(commands)
    _tool_commands(commands)
    _service_commands(commands)
    return parser


@dataclass(frozen=True)
class Commands:
    """The subcommands being declared, and the options several of them share."""

    subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
    formatter: type[argparse.HelpFormatter]

    def command(self, name: str, summary: str, details: str = "") -> argparse.ArgumentParser:
        return self.subparsers.add_parser(
            name,
            help=summary,
            description=summary + (f"\n\n{details}" if details else ""),
            formatter_class=self.formatter,
        )

    def run_id(self, sub: argparse.ArgumentParser, required: bool = False) -> None:
        sub.add_argument(
            "--run-id",
            required=required,
            default=None,
            metavar="ID",
            help="the run this command belongs to (Airflow passes its run id; default: "
            "the command and the current time)",
        )

    def interval(self, sub: argparse.ArgumentParser, what: str, required: bool = False) -> None:
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


def _scheduled_commands(c: Commands) -> None:
    """What a scheduled run calls: ingest, run, validate, drain, stage, backfill."""
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
        sub = c.command(name, summary, details)
        c.run_id(sub)
        c.interval(sub, "data interval")
    stage = c.command(
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
    c.run_id(stage)
    c.interval(stage, "data interval")
    backfill = c.command(
        "backfill",
        "re-join an interval against the masters as of its end and replace it",
        "The replaced interval is audited before it is published; live state is not disturbed.",
    )
    c.interval(backfill, "interval", required=True)
    c.run_id(backfill)


def _inspection_commands(c: Commands) -> None:
    """What reads the pipeline: status, plan, report, and resolve for quarantined batches."""
    status = c.command("status", "offsets, lag, landing files and the last runs (no Spark)")
    status.add_argument("--json", action="store_true", help="print JSON instead of tables")
    plan = c.command(
        "plan",
        "what the cost models recommend for a stage, from its recorded steps (no Spark)",
        "SSBJ stages: Eq. 2 fitted to the measured steps, then k, steps per run and memory "
        "(Eq. 1, 3-5). Theta stages: the configured scheme, the one chosen last, and the kept "
        "A-DSP layout.",
    )
    plan.add_argument("name", metavar="STAGE", help="the stage's name in the config")
    report = c.command("report", "write the HTML run report of a range of runs")
    c.interval(report, "report range")
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
    resolve = c.command(
        "resolve",
        "close a quarantined output batch",
        "Without --publish the batch stays out of the published table; with it, its rows "
        "are published as they are.",
    )
    resolve.add_argument("name", metavar="TABLE", help="the output table")
    c.run_id(resolve, required=True)
    resolve.add_argument(
        "--publish", action="store_true", help="publish the quarantined rows as they are"
    )


def _tool_commands(c: Commands) -> None:
    """Set-up and upkeep: demo-data, generate-dag, maintain."""
    demo = c.command(
        "demo-data", "generate TPC-H masters and Zipf stream files for the demo config"
    )
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
    generate = c.command(
        "generate-dag",
        "write the config's Airflow DAG file (and quality_report_<name>.py beside it)",
    )
    generate.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="the DAG file to write"
    )
    maintain = c.command(
        "maintain",
        "compact, then vacuum every Delta table of the pipeline, keeping the versions it pins",
    )
    c.run_id(maintain)
    maintain.add_argument(
        "--retention-hours",
        type=float,
        default=None,
        metavar="H",
        help="override warehouse.vacuum_retention_hours for this run",
    )


def _service_commands(c: Commands) -> None:
    """Long-running processes: spark-server, worker, stream."""
    server = c.command(
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
    worker = c.command(
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
    stream = c.command(
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
        "every stage's freshness.stream_within (SSBJ: bound / (k + 1))",
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


def parse_args(argv: Sequence[str]) -> tuple[JobArgs, str]:
    ns = build_parser().parse_args(list(argv))
    if ns.wait < 0:
        raise ConfigError(f"--wait must be >= 0 seconds, got {ns.wait}")
    if ns.command == "backfill" and ns.start >= ns.end:
        raise ConfigError(f"backfill: --start {ns.start} must be before --end {ns.end}")
    run_id = getattr(ns, "run_id", None) or f"{ns.command}__{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    given = vars(ns)
    options = {f.name: OPTION_OF.get(f.name, f.name) for f in fields(JobArgs) if f.name != "run_id"}
    args = JobArgs(
        run_id=run_id,
        **{name: given[option] for name, option in options.items() if option in given},
    )
    if args.via_worker and args.command in ("worker", "spark-server", "stream"):
        raise ConfigError(f"--worker runs pipeline commands; `{args.command}` runs on its own")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        raise ConfigError(f"--idle-timeout must be > 0 seconds, got {args.idle_timeout}")
    return args, ns.log_level
