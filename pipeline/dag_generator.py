"""Render a thin Airflow DAG file from a pipeline config.

The DAG files are rendered from jinja2 templates (``pipeline/templates/*.py.j2``). A DAG
file holds only constants, the ``DAG`` and its operators: the stage list is baked
in at generation time, so parsing it reads no files and imports neither Spark nor GX.
``enrich generate-dag`` rewrites it; a test fails when a committed DAG is out of date.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig

TEMPLATES = "templates"  # pipeline/templates/*.py.j2, rendered with jinja2


def _render(template: str, **fields: Any) -> str:
    from jinja2 import Environment, PackageLoader, StrictUndefined

    environment = Environment(
        loader=PackageLoader("pipeline", TEMPLATES),
        undefined=StrictUndefined,  # a field the template names but the generator lacks
        keep_trailing_newline=True,
        autoescape=False,  # the output is Python source, not HTML
    )
    return environment.get_template(template).render(**fields)


def quality_dag_path(config: PipelineConfig, dag_path: Path) -> Path:
    """The quality-report DAG is written beside the pipeline DAG."""
    return dag_path.parent / f"quality_report_{config.name}.py"


def _datetime_args(moment: datetime) -> str:
    """``datetime(...)``'s arguments for ``moment`` (to the minute), as a DAG file writes it."""
    return ", ".join(
        str(v) for v in (moment.year, moment.month, moment.day, moment.hour, moment.minute)
    )


def _common_fields(config: PipelineConfig, config_path: Path, dag_path: Path) -> dict[str, Any]:
    start, end = config.schedule.start, config.schedule.end
    repo_root = dag_path.resolve().parent.parent
    config_rel = os.path.relpath(config_path.resolve(), repo_root)
    return {
        "name": config.name,
        "name_literal": json.dumps(config.name),
        "config_rel": config_rel,
        "config_literal": json.dumps(config_rel),
        "start_args": _datetime_args(start),
        "end_args": _datetime_args(end) if end is not None else None,
        "catchup": config.schedule.catchup,
        "outputs": _tuple_literal(config.outputs()),
    }


def render_dag(config: PipelineConfig, config_path: Path, dag_path: Path) -> str:
    repo_root = dag_path.resolve().parent.parent
    return _render(
        "pipeline_dag.py.j2",
        **_common_fields(config, config_path, dag_path),
        out_rel=os.path.relpath(dag_path.resolve(), repo_root),
        stage_list="\n".join(f"- `{s.name}` ({s.kind})" for s in config.stages) or "none",
        stages=_tuple_literal([s.name for s in config.stages]),
        pool=config.schedule.pool,
        pool_literal=json.dumps(config.schedule.pool),
        interval_seconds=int(config.schedule.interval_delta.total_seconds()),
        retries=config.schedule.retries,
        task_timeout_seconds=int(config.schedule.task_timeout_delta.total_seconds()),
        worker=config.schedule.worker.enabled,
    )


def render_quality_dag(config: PipelineConfig, config_path: Path, dag_path: Path) -> str:
    """``dag_path`` is the pipeline DAG's path; the report DAG goes beside it."""
    repo_root = dag_path.resolve().parent.parent
    return _render(
        "quality_dag.py.j2",
        **_common_fields(config, config_path, dag_path),
        pipeline_out_rel=os.path.relpath(dag_path.resolve(), repo_root),
    )


def _tuple_literal(names: list[str]) -> str:
    if not names:
        return "()"
    if len(names) == 1:
        return f"({json.dumps(names[0])},)"
    inner = ", ".join(json.dumps(n) for n in names)
    if len(inner) + 12 <= 100:
        return f"({inner})"
    return "(\n" + "".join(f"    {json.dumps(n)},\n" for n in names) + ")"


def write_dag(config: PipelineConfig, config_path: Path, dag_path: Path) -> list[Path]:
    """Write the pipeline DAG to ``dag_path`` and its quality-report DAG beside it."""
    dag_path.parent.mkdir(parents=True, exist_ok=True)
    dag_path.write_text(render_dag(config, config_path, dag_path))
    report_path = quality_dag_path(config, dag_path)
    report_path.write_text(render_quality_dag(config, config_path, dag_path))
    return [dag_path, report_path]
