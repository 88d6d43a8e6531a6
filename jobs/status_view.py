"""``enrich status`` as tables: what an operator reads first when a run looks wrong.

The data comes from :func:`pipeline.status.pipeline_status` (also printed as JSON with
``--json``); this module only lays it out, with rich, for a terminal or a task log.
"""

from __future__ import annotations

import shutil
from datetime import datetime
from typing import IO, Any

from rich.console import Console
from rich.table import Table


def _count(value: int) -> str:
    return f"{value:,}"


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return "" if value is None else str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "running"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s"


def _minute(value: Any) -> str:
    return f"{value:%Y-%m-%d %H:%M}" if isinstance(value, datetime) else _when(value)


def _share(value: float) -> str:
    return f"{value * 100:.1f}%"


def _complete(interval: dict[str, Any]) -> str:
    if interval["complete"]:
        return "yes"
    return "no, OVERDUE" if interval["overdue"] else "no"


def completeness_table(completeness: dict[str, Any]) -> Table:
    """Each output (with its freshness bound) and its intervals, newest first: tuples,
    waiting, share published, when the longest-waiting tuple entered its stage, complete;
    incomplete past the bound: OVERDUE. ``status --json`` has the rest (completed at, by)."""
    table = Table(
        title="intervals per output (complete: none of its tuples waits in the output's chain)",
        title_justify="left",
    )
    table.add_column("output")
    table.add_column("interval start", no_wrap=True)
    for column in ("tuples", "waiting", "published"):
        table.add_column(column, justify="right")
    table.add_column("oldest waiting entered", no_wrap=True)
    table.add_column("complete", no_wrap=True)
    for name, info in completeness.items():
        label = f"{name}\nwithin {info['freshness_bound']}"
        if not info["intervals"]:
            table.add_row(label, "none recorded yet")
        for index, interval in enumerate(info["intervals"]):
            waiting = _count(interval["waiting"])
            if interval["quarantined"]:
                waiting += f" +{_count(interval['quarantined'])} quarantined"
            table.add_row(
                label if index == 0 else "",
                _minute(interval["interval_start"]),
                _count(interval["tuples"]),
                waiting,
                _share(interval["share_answered"]),
                _minute(interval["oldest_waiting_entered_at"]),
                _complete(interval),
            )
    return table


def status_tables(status: dict[str, Any]) -> list[Table]:
    """The tables of one status: streams, rejected files (if any), stages, each output's
    intervals, last runs."""
    streams = Table(title="streams", title_justify="left")
    for column in (
        "stream",
        "loaded",
        "rejected",
        "in flight",
        "duplicate",
        "missing",
        "records",
        "quarantined",
        "re-sent",
    ):
        streams.add_column(column, justify="left" if column == "stream" else "right")
    streams.add_column("landing", overflow="fold")
    rejected = Table(title="rejected files still in the landing zone", title_justify="left")
    for column in ("stream", "file", "reason", "rejected at"):
        rejected.add_column(column, overflow="fold")
    for name, info in status["streams"].items():
        streams.add_row(
            name,
            _count(info["files_loaded"]),
            _count(info["files_rejected"]),
            _count(info["files_in_flight"]),
            _count(info["files_duplicate"]),
            _count(info["files_missing"]),
            _count(info["records_loaded"]),
            _count(info["records_quarantined"]),
            _count(info["records_resent"]),
            info["landing"],
        )
        for row in info["rejected_in_place"]:
            rejected.add_row(name, row["path"], row["reason"] or "", _when(row["rejected_at"]))
    stages = Table(title="stages", title_justify="left")
    for column in ("stage", "consumed", "latest", "behind", "steps"):
        stages.add_column(column, justify="left" if column == "stage" else "right")
    stages.add_column("output", overflow="fold")
    for name, info in status["stages"].items():
        stages.add_row(
            name,
            f"v{info['consumed_version']}",
            f"v{info['latest_input_version']}",
            _count(info["versions_behind"]),
            _count(info["steps"]),
            info["output"],
        )
    runs = Table(title="last runs", title_justify="left")
    for column in ("run", "kind", "status", "started", "took"):
        runs.add_column(column, justify="right" if column == "took" else "left", overflow="fold")
    runs.add_column("error", overflow="fold")
    for run in status["last_runs"]:
        runs.add_row(
            run["run_id"],
            run["kind"],
            run["status"],
            _when(run.get("started_at")),
            _duration(run.get("seconds")) if run["status"] != "running" else "running",
            run["error"] or "",
        )
    tables = [streams]
    if rejected.row_count:
        tables.append(rejected)
    return [*tables, stages, completeness_table(status.get("completeness", {})), runs]


def print_status(status: dict[str, Any], file: IO[str] | None = None) -> None:
    """Print the status tables; plain text (no colour codes) unless ``file`` is a terminal.

    As wide as the terminal (or ``COLUMNS``); 120 columns in a log or a pipe, where long
    paths fold within their cells.
    """
    console = Console(file=file, width=shutil.get_terminal_size((120, 24)).columns)
    for table in status_tables(status):
        console.print(table)
