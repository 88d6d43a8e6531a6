"""A plain-text run report: per-run, per-stage metrics from the state store."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from pathlib import Path

from pipeline.context import PipelineContext


def write_text_report(
    pipeline: PipelineContext, start: datetime | None, end: datetime | None, out: Path | None
) -> Path:
    rows: dict[tuple[str, str, int], dict[str, float]] = defaultdict(dict)
    for metric in pipeline.store.metrics():
        if start and metric.recorded_at.replace(tzinfo=start.tzinfo) < start:
            continue
        if end and metric.recorded_at.replace(tzinfo=end.tzinfo) >= end:
            continue
        rows[(metric.run_id, metric.stage, metric.step)][metric.name] = metric.value
    lines = [f"# Run report: {pipeline.config.name}", ""]
    for (run_id, stage, step), values in sorted(rows.items()):
        shown = ", ".join(f"{k}={v:g}" for k, v in sorted(values.items()))
        lines.append(f"- {run_id} | {stage} | step {step} | {shown}")
    target = out or Path(pipeline.config.warehouse.root) / "_reports" / "run-report.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n")
    return target
