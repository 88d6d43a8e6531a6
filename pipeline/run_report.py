"""Render the HTML run report for a range of runs (``enrich report``).

Reads the state store's metrics, run ledger and interval completeness and the audit's
quarantine records, and writes one self-contained HTML file, by default
``<warehouse.local_root>/_reports/run-report_<range>.html``.
"""

from __future__ import annotations

import glob
import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.completeness import completeness_status
from pipeline.context import PipelineContext
from reports.html_report import render_report
from reports.run_table import run_rows
from reports.series import RunPoint, run_points

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WrittenReport:
    path: Path
    runs: int
    unresolved: list[dict[str, Any]]


def _range_label(start: datetime | None, end: datetime | None) -> str:
    if start is None and end is None:
        return "all"
    first = f"{start:%Y%m%dT%H%M}" if start else "begin"
    last = f"{end:%Y%m%dT%H%M}" if end else "now"
    return f"{first}_{last}"


def validation_pages(site: Path, run_id: str) -> list[tuple[str, str]]:
    """(suite, URL) of the Data Docs pages of ``run_id``'s validations (GX lays them out as
    ``validations/<suite>/<run name>/<run time>/<batch>.html``)."""
    if not (site / "validations").is_dir():
        return []
    pages = sorted(site.glob(f"validations/*/{glob.escape(run_id)}/*/*.html"))
    return [(page.relative_to(site / "validations").parts[0], page.as_uri()) for page in pages]


def write_run_report(
    pipeline: PipelineContext, start: datetime | None, end: datetime | None, out: Path | None
) -> WrittenReport:
    # The report links each run's Data Docs pages: those validate queued are rendered first.
    pipeline.auditor.render_queued_docs()
    ledger = pipeline.store.runs(limit=1_000_000)
    points: list[RunPoint] = run_points(pipeline.store.metrics(), ledger, start, end)
    in_range = {p.run_id for p in points}
    unresolved = [u for u in pipeline.auditor.unresolved() if u["run_id"] in in_range]
    docs = Path(pipeline.layout.gx_project()) / "gx/uncommitted/data_docs/local_site/index.html"
    html = render_report(
        pipeline.config.name,
        points,
        start,
        end,
        unresolved,
        docs if docs.exists() else None,
        runs=run_rows(ledger, points),
        run_links={p.run_id: validation_pages(docs.parent, p.run_id) for p in points},
        completeness=completeness_status(pipeline.config, pipeline.store, since=start, until=end),
    )
    target = out or Path(pipeline.layout.reports()) / f"run-report_{_range_label(start, end)}.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(html)
    logger.info("run report for %d run(s) written to %s", len(points), target)
    return WrittenReport(target, len(points), unresolved)
