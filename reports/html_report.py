"""The self-contained HTML run report: one file with inline SVG plots, no external assets.

Plots (one point per run, see :mod:`reports.series`): cache hit rate, pending-state size,
master bytes read, rows in / out / quarantined, and validation pass/fail. Below them, the
unresolved quarantined batches and a link to the GX Data Docs.
"""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from common.phase_clock import TOTAL
from reports.series import RunPoint, phase_series, stage_series

PLOT_IDS = (
    "cache-hit-rate",
    "pending-state",
    "master-bytes",
    "rows",
    "validation",
    "task-seconds",
)


def _svg(figure: Any) -> str:
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _line_plot(
    title: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    ylabel: str,
    bars: bool = False,
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(7.5, 2.8))
    positions = list(range(len(labels)))
    width = 0.8 / max(1, len(series))
    for index, (name, values) in enumerate(series.items()):
        ys = [float("nan") if v is None else v for v in values]
        if bars:
            axes.bar([p + index * width for p in positions], ys, width=width, label=name)
        else:
            axes.plot(positions, ys, marker="o", label=name)
    axes.set_title(title)
    axes.set_ylabel(ylabel)
    axes.set_xticks(positions)
    axes.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    if series:
        axes.legend(fontsize=7)
    axes.grid(alpha=0.3)
    try:
        return _svg(figure)
    finally:
        plt.close(figure)


TIMED_RUNS = 5  # the task-timing table shows the latest runs; the plot shows them all


def _task_table(points: Sequence[RunPoint]) -> list[str]:
    """One row per task of the latest runs: seconds in total and per phase."""
    phases = list(phase_series(list(points)))  # the phases any of these tasks went through
    rows = [(p.run_id, task, t) for p in points for task, t in sorted(p.task_seconds.items())]
    out = [f"<h2>Task timings (latest {len(points)} run(s))</h2>"]
    if not rows:
        return [*out, "<p>No task timings recorded in this range.</p>"]
    head = "".join(f"<th>{html.escape(p)}</th>" for p in phases)
    out.append(f"<table id='task-timings'><tr><th>run</th><th>task</th><th>total</th>{head}</tr>")
    for run_id, task, seconds in rows:
        cells = "".join(f"<td>{seconds.get(p, 0.0):.1f}</td>" for p in phases)
        out.append(
            f"<tr><td>{html.escape(run_id)}</td><td>{html.escape(task)}</td>"
            f"<td>{seconds.get(TOTAL, 0.0):.1f}</td>{cells}</tr>"
        )
    out.append("</table>")
    return out


def render_report(
    pipeline_name: str,
    points: list[RunPoint],
    start: datetime | None,
    end: datetime | None,
    unresolved: Sequence[Mapping[str, Any]],
    docs_index: Path | None,
) -> str:
    labels = [f"{p.at:%m-%d %H:%M}" for p in points]
    plots = {
        "cache-hit-rate": _line_plot(
            "Cache hit rate (SSBJ stages)",
            labels,
            stage_series(points, "cache_hit_rate"),
            "hits / tuples in",
        ),
        "pending-state": _line_plot(
            "Pending-state size after the run (H_S rows)",
            labels,
            stage_series(points, "pending_rows"),
            "rows",
        ),
        "master-bytes": _line_plot(
            "Master bytes read", labels, stage_series(points, "master_bytes_read"), "bytes"
        ),
        "rows": _line_plot(
            "Rows in, out and quarantined",
            labels,
            {
                "in (ingested)": [p.rows_in for p in points],
                "out (stage outputs)": [p.rows_out for p in points],
                "quarantined": [p.rows_quarantined for p in points],
            },
            "rows",
            bars=True,
        ),
        "validation": _line_plot(
            "Validation: output batches passed / failed",
            labels,
            {
                "passed": [float(p.batches_passed) for p in points],
                "failed": [float(p.batches_failed) for p in points],
            },
            "batches",
            bars=True,
        ),
        "task-seconds": _line_plot(
            "Where each run's time went (seconds, all tasks)",
            labels,
            phase_series(points),
            "seconds",
            bars=True,
        ),
    }
    window = f"{start.isoformat() if start else 'beginning'} to {end.isoformat() if end else 'now'}"
    failing_runs = [p for p in points if p.batches_failed]
    body = [
        f"<h1>Run report: {html.escape(pipeline_name)}</h1>",
        f"<p>Runs with a data interval from {html.escape(window)}: <b>{len(points)}</b>; "
        f"runs with failed validation: <b>{len(failing_runs)}</b>.</p>",
    ]
    if not points:
        body.append("<p class='empty'>No runs in this range.</p>")
    for plot_id, svg in plots.items():
        body.append(f"<section class='plot' id='{plot_id}'>{svg}</section>")
    body.extend(_task_table(points[-TIMED_RUNS:]))
    body.append("<h2>Failed validations</h2>")
    if failing_runs:
        body.append("<ul>")
        for p in failing_runs:
            body.append(
                f"<li>{html.escape(p.run_id)}: {html.escape(', '.join(p.failed_tables))}</li>"
            )
        body.append("</ul>")
    else:
        body.append("<p>None in this range.</p>")
    body.append("<h2>Unresolved quarantined batches</h2>")
    if unresolved:
        body.append("<table id='unresolved'><tr><th>table</th><th>run</th><th>failed</th></tr>")
        for entry in unresolved:
            failures = "<br>".join(html.escape(str(f)) for f in entry.get("failures", []))
            body.append(
                f"<tr><td>{html.escape(str(entry['table']))}</td>"
                f"<td>{html.escape(str(entry['run_id']))}</td><td>{failures}</td></tr>"
            )
        body.append("</table>")
    else:
        body.append("<p>None.</p>")
    if docs_index is not None:
        body.append(
            f"<p>Expectation-level results: <a id='data-docs' href='{docs_index.as_uri()}'>"
            "Great Expectations Data Docs</a>.</p>"
        )
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
        "section.plot{margin:1em 0}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;vertical-align:top;font-size:.9em}"
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>Run report: {html.escape(pipeline_name)}</title><style>{style}</style>"
        "</head><body>" + "\n".join(body) + "</body></html>\n"
    )
