"""Run-report series: metrics reduce to one point per run, placed by data interval."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from reports.html_report import PLOT_IDS, render_report
from reports.series import phase_series, run_points, stage_series

T0 = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass
class M:
    run_id: str
    stage: str
    step: int
    name: str
    value: float
    recorded_at: datetime = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class L:
    run_id: str
    interval_start: datetime | None


def metrics() -> list[M]:
    return [
        M("a", "ingest.orders", 0, "records_loaded", 100),
        M("a", "ingest.orders", 0, "records_quarantined", 2),
        M("a", "s1", 1, "tuples_in", 100),
        M("a", "s1", 1, "cache_hits", 30),
        M("a", "s1", 1, "pending_rows", 70),
        M("a", "s1", 1, "output_rows", 30),
        M("a", "s1", 1, "master_bytes_read", 1000),
        M("a", "s1", 2, "tuples_in", 0),
        M("a", "s1", 2, "cache_hits", 0),
        M("a", "s1", 2, "pending_rows", 20),
        M("a", "s1", 2, "output_rows", 50),
        M("a", "s1", 2, "master_bytes_read", 500),
        M("a", "quality.out", 3, "batch_failed", 1),
        M("a", "quality.out", 3, "rows_quarantined", 80),
        M("b", "ingest.orders", 0, "records_loaded", 10),
        M("b", "quality.out", 4, "batch_failed", 0),
        M("adhoc", "s1", 3, "output_rows", 5, recorded_at=datetime(2026, 1, 2, tzinfo=UTC)),
        M("a", "task.run", 0, "seconds.session_start", 4.0),
        M("a", "task.run", 0, "seconds.write", 2.5),
        M("a", "task.run", 0, "seconds.total", 7.0),
        M("a", "task.validate", 0, "seconds.validate", 3.0),
        M("a", "task.validate", 0, "seconds.total", 3.5),
        M("a", "task.validate", 0, "seconds.total", 1.5),  # a retried task's second attempt
    ]


def test_one_point_per_run_with_rates_sums_and_last_pending() -> None:
    ledger = [L("b/ingest", T0 + timedelta(hours=1)), L("a/validate", T0), L("a/ingest", T0)]
    points = run_points(metrics(), ledger)
    assert [p.run_id for p in points] == ["a", "b", "adhoc"]
    a, b, adhoc = points
    assert a.at == T0 and b.at == T0 + timedelta(hours=1)
    assert adhoc.at == datetime(2026, 1, 2, tzinfo=UTC)
    assert a.cache_hit_rate == {"s1": 0.3}
    assert a.pending_rows == {"s1": 20}  # after the run's last step
    assert a.master_bytes_read == {"s1": 1500}
    assert (a.rows_in, a.rows_out, a.rows_quarantined) == (100, 80, 82)
    assert (a.stage_in, a.stage_out) == ({"s1": 100}, {"s1": 80})  # per stage, not summed
    assert (a.batches_failed, a.failed_tables, b.batches_passed) == (1, ["out"], 1)
    assert stage_series(points, "pending_rows") == {"s1": [20, None, None]}
    # Task timings are their own series, never a stage's.
    assert a.task_seconds == {
        "run": {"session_start": 4.0, "write": 2.5, "total": 7.0},
        "validate": {"validate": 3.0, "total": 5.0},
    }
    assert phase_series(points) == {
        "session_start": [4.0, 0.0, 0.0],
        "validate": [3.0, 0.0, 0.0],
        "write": [2.5, 0.0, 0.0],
    }


def test_range_selects_runs_by_data_interval() -> None:
    ledger = [L("a/ingest", T0), L("b/ingest", T0 + timedelta(hours=1))]
    points = run_points(metrics(), ledger, T0 + timedelta(minutes=30), T0 + timedelta(days=1))
    assert [p.run_id for p in points] == ["b"]


def test_rendered_report_has_every_plot_as_inline_svg() -> None:
    points = run_points(metrics(), [L("a/ingest", T0)])
    unresolved = [{"table": "out", "run_id": "a", "failures": ["x: 3 of 9 row(s) failed"]}]
    html = render_report("demo", points, None, None, unresolved, None)
    for plot_id in PLOT_IDS:
        section = html.split(f"id='{plot_id}'>", 1)[1].split("</section>", 1)[0]
        assert section.startswith("<svg") and "<path" in section
    assert "x: 3 of 9 row(s) failed" in html
    timings = html.split("id='task-timings'>", 1)[1].split("</table>", 1)[0]
    assert "<td>a</td><td>validate</td><td>5.0</td>" in timings
    assert not re.search(r"(src|href)=['\"]https?:", html), "the report loads nothing from outside"
