"""The report's per-run table and plots: outcomes from the ledger, aligned plots with units."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from reports.html_report import PLOT_IDS, render_report
from reports.plots import format_value, plot_svg
from reports.run_table import run_rows
from reports.series import RunPoint

T0 = datetime(2024, 1, 1, tzinfo=UTC)
FAILURE = "be_between(price): 2 of 9 row(s) failed; e.g. 2000.0, 1500.0"
LONG_NAME = "a very long series name"


@dataclass
class Task:
    run_id: str
    status: str
    started_at: datetime
    finished_at: datetime | None
    error: str | None = None
    interval_start: datetime | None = T0
    interval_end: datetime | None = T0 + timedelta(hours=1)


def test_a_run_row_gathers_its_tasks() -> None:
    ledger = [
        Task("a/ingest", "succeeded", T0, T0 + timedelta(seconds=10)),
        Task("a/validate", "failed", T0 + timedelta(seconds=20), T0 + timedelta(seconds=95),
             "exit code 3"),
        Task("b/ingest", "running", T0 + timedelta(hours=1), None),
    ]  # fmt: skip
    a = RunPoint("a", T0, stage_out={"s1": 30, "s2": 12}, rows_in=50, batches_failed=1)
    b = RunPoint("b", T0 + timedelta(hours=1))
    first, second = run_rows(ledger, [a, b])
    assert (first.outcome, first.errors, first.seconds, first.tasks) == (
        "failed",
        ("validate: exit code 3",),
        95.0,
        2,
    )
    assert (first.rows_in, first.rows_out, first.batches_failed) == (50, 42, 1)
    assert (second.outcome, second.seconds) == ("running", None)
    html = render_report(
        "demo",
        [a, b],
        None,
        None,
        [{"table": "out", "run_id": "a", "failures": [FAILURE]}],
        None,
        runs=[first, second],
        run_links={"a": [("out_suite", "file:///site/validations/out_suite/a/x/y.html")]},
    )  # fmt: skip
    runs = html.split("id='runs'>", 1)[1].split("</table>", 1)[0]
    assert "<tr class='failed'>" in runs and "validate: exit code 3" in runs
    assert "95.0 s" in runs and "<td class='num'>42</td>" in runs
    assert "href='file:///site/validations/out_suite/a/x/y.html'>out_suite</a>" in runs
    assert "e.g. 2000.0, 1500.0" in html.split("id='unresolved'>", 1)[1]
    assert html.count("<svg") == len(PLOT_IDS)


def test_values_read_in_their_units() -> None:
    assert format_value(3 * 2**20, "bytes") == "3.0 MiB" and format_value(512, "bytes") == "512 B"
    assert format_value(0.25, "share") == "25%" and format_value(12345, "rows") == "12,345"
    assert format_value(90, "seconds") == "90.0 s" and format_value(600, "seconds") == "10.0 min"


def test_plots_share_one_size_and_all_zero_values_sit_on_the_floor() -> None:
    labels = ["01-01 00:00", "01-01 01:00"]
    sized = {
        re.search(r'width="([\d.]+pt)" height="([\d.]+pt)"', svg).groups()  # type: ignore[union-attr]
        for svg in (
            plot_svg("a", labels, {"x": [1.0, 2.0]}, "rows"),
            plot_svg("b, a longer title", labels, {LONG_NAME: [3e9, 1e9]}, "bytes", bars=True),
        )
    }  # fmt: skip
    assert len(sized) == 1, "plots of different widths do not line up"
    zeros = plot_svg("pending", labels, {"s1": [0.0, 0.0]}, "rows")
    assert "0.04" not in zeros and "−0.04" not in zeros
    assert "GiB" in plot_svg("bytes", labels, {"x": [3e9, 1e9]}, "bytes")


def test_the_report_shows_each_outputs_intervals_and_flags_the_overdue() -> None:
    interval = {
        "interval_start": T0,
        "interval_end": T0 + timedelta(hours=1),
        "tuples": 10,
        "waiting": 4,
        "quarantined": 1,
        "share_answered": 0.5,
        "oldest_waiting_entered_at": T0 + timedelta(minutes=70),
        "complete": False,
        "completed_at": None,
        "completed_run_id": None,
        "overdue": True,
    }
    done = interval | {
        "interval_start": T0 - timedelta(hours=1),
        "interval_end": T0,
        "waiting": 0,
        "quarantined": 0,
        "share_answered": 1.0,
        "complete": True,
        "completed_at": T0 + timedelta(minutes=5),
        "overdue": False,
    }
    completeness = {
        "out": {"freshness_bound": "2 intervals (2h)", "intervals": [interval, done]},
        "other": {"freshness_bound": "1 interval (1h)", "intervals": []},
    }
    html = render_report("demo", [], None, None, [], None, completeness=completeness)
    table = html.split("id='completeness'>", 1)[1].split("</table>", 1)[0]
    overdue, complete = (
        table.split("<tr class='overdue'>")[1],
        table.split("<tr class='complete'>")[1],
    )
    assert "<td>out</td>" in overdue and "<td>2 intervals (2h)</td>" in overdue
    assert "2024-01-01 00:00 &ndash; 2024-01-01 01:00" in overdue
    assert "4 (+1 quarantined)" in overdue and "50.0%" in overdue and "no, overdue" in overdue
    assert "<td class='complete'>yes</td>" in complete and "100.0%" in complete
    assert "2024-01-01 00:05" in complete
    assert "no interval recorded in this range" in table.split("<td>other</td>", 1)[1]
