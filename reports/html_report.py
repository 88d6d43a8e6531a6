"""The self-contained HTML run report: one file with inline SVG plots, no external assets.

Rendered from the jinja2 template ``reports/templates/run_report.html.j2``:

1. a per-run table: run id, data interval, start, duration, outcome (with the failed
   tasks' errors), rows in and out, validations, and links to the run's Data Docs pages;
2. the failed expectations of unresolved quarantined batches, inline with their unexpected
   counts and sample values, so the report explains a failure on its own, offline;
   then each output's intervals: tuples, waiting, share published, the oldest waiting
   tuple, complete or not, overdue (incomplete past the output's freshness bound);
3. aligned plots, one point per run (:mod:`reports.series`, :mod:`reports.plots`): cache
   hit rate, pending state, master bytes read, tuples in and rows out per stage, rows
   ingested and quarantined, validations, step seconds per stage, task seconds per phase;
4. the latest runs' task timings per phase.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from common.phase_clock import TOTAL
from reports.plots import Unit, format_value, plot_svg
from reports.run_table import RunRow
from reports.series import RunPoint, phase_series, stage_series

TIMED_RUNS = 5  # the task-timing table shows the latest runs; the plot shows them all


@dataclass(frozen=True)
class PlotSpec:
    id: str
    title: str
    unit: Unit
    series: Callable[[list[RunPoint]], Mapping[str, Sequence[float | None]]]
    bars: bool = False


def _stage_flow(points: list[RunPoint]) -> Mapping[str, Sequence[float | None]]:
    flow: dict[str, list[float | None]] = {}
    for stage, values in stage_series(points, "stage_in").items():
        flow[f"{stage} in"] = values
        flow[f"{stage} out"] = stage_series(points, "stage_out")[stage]
    return flow


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "cache-hit-rate",
        "Cache hit rate (SSBJ stages): tuples served by the cache",
        "share",
        lambda p: stage_series(p, "cache_hit_rate"),
    ),
    PlotSpec(
        "pending-state",
        "Pending state after the run (H_S tuples)",
        "rows",
        lambda p: stage_series(p, "pending_rows"),
    ),
    PlotSpec(
        "master-bytes",
        "Master bytes read per stage",
        "bytes",
        lambda p: stage_series(p, "master_bytes_read"),
        bars=True,
    ),
    PlotSpec("stage-rows", "Per stage: tuples in and rows out", "rows", _stage_flow, bars=True),
    PlotSpec(
        "ingest-rows",
        "Ingested, quarantined and re-sent rows",
        "rows",
        lambda p: {
            "ingested": [x.rows_in for x in p],
            "quarantined": [x.rows_quarantined for x in p],
            "re-sent": [x.rows_resent for x in p],
        },
        bars=True,
    ),
    PlotSpec(
        "validation",
        "Validations: output batches passed / failed",
        "count",
        lambda p: {
            "passed": [float(x.batches_passed) for x in p],
            "failed": [float(x.batches_failed) for x in p],
        },
        bars=True,
    ),
    PlotSpec(
        "step-seconds",
        "Step time per stage",
        "seconds",
        lambda p: stage_series(p, "step_seconds"),
        bars=True,
    ),
    PlotSpec(
        "task-seconds",
        "Where each run's time went (all tasks, per phase)",
        "seconds",
        phase_series,
        bars=True,
    ),
)
PLOT_IDS = tuple(p.id for p in PLOTS)


def _environment() -> Any:
    from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

    environment = Environment(
        loader=PackageLoader("reports", "templates"),
        autoescape=select_autoescape(["html", "j2"]),
        undefined=StrictUndefined,  # a misspelt name fails the render, not the reader
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["value"] = format_value
    environment.filters["when"] = lambda d: "" if d is None else f"{d:%Y-%m-%d %H:%M}"
    return environment


def render_report(
    pipeline_name: str,
    points: list[RunPoint],
    start: datetime | None,
    end: datetime | None,
    unresolved: Sequence[Mapping[str, Any]],
    docs_index: Path | None,
    runs: Sequence[RunRow] = (),
    run_links: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    completeness: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """The report's HTML. ``run_links`` maps a run id to (label, URL) links of its pages;
    ``completeness`` is each output's intervals as ``enrich status --json`` shows them."""
    from markupsafe import Markup

    labels = [f"{p.at:%m-%d %H:%M}" for p in points]
    plots = [
        (spec.id, Markup(plot_svg(spec.title, labels, spec.series(points), spec.unit, spec.bars)))
        for spec in PLOTS
    ]
    timed = points[-TIMED_RUNS:]
    phases = list(phase_series(timed))
    timings = [
        (p.run_id, task, seconds.get(TOTAL, 0.0), [seconds.get(ph, 0.0) for ph in phases])
        for p in timed
        for task, seconds in sorted(p.task_seconds.items())
    ]
    window = f"{start.isoformat() if start else 'beginning'} to {end.isoformat() if end else 'now'}"
    return str(
        _environment()
        .get_template("run_report.html.j2")
        .render(
            name=pipeline_name,
            window=window,
            points=points,
            failing=[p for p in points if p.batches_failed],
            runs=runs,
            run_links=run_links or {},
            unresolved=unresolved,
            plots=plots,
            phases=phases,
            timings=timings,
            timed_runs=len(timed),
            docs_uri=docs_index.as_uri() if docs_index is not None else None,
            completeness=completeness or {},
        )
    )
