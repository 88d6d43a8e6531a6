"""Render a thin Airflow DAG file from a pipeline config.

The DAG file holds only constants, the ``DAG`` and its operators: the stage list is baked
in at generation time, so parsing it reads no files and imports neither Spark nor GX.
``enrich generate-dag`` rewrites it; a test fails when a committed DAG is out of date.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.config import PipelineConfig

TEMPLATE = '''"""
### Enrichment pipeline `{name}`

Generated from the pipeline config by
`enrich --config {config_rel} generate-dag --out {out_rel}`;
regenerate it instead of editing it.

Every interval: **ingest** the complete landing files, run one step of each **stage** in
config order, then **validate**: audit each output batch against its Great Expectations
suites and publish it to `gold/`, or quarantine it and fail the run. Stages:
{stage_list}

Each task calls the `enrich` CLI with the run id and the data interval, so the same work
runs without Airflow. Backfills: `enrich backfill --start ... --end ...`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, DeltaDataIntervalTimetable, chain

from orchestration.airflow_tasks import run_enrich

CONFIG = str(Path(__file__).resolve().parent.parent / {config_literal})
STAGES = {stages}
INTERVAL = timedelta(seconds={interval_seconds})
START = datetime({start_args}, tzinfo=UTC)
RUN_ARGS = [
    "--run-id",
    "{{{{ run_id }}}}",
    "--start",
    "{{{{ data_interval_start.isoformat() }}}}",
    "--end",
    "{{{{ data_interval_end.isoformat() }}}}",
]

with DAG(
    dag_id="enrich_{name}",
    schedule=DeltaDataIntervalTimetable(INTERVAL),
    start_date=START,
    catchup={catchup},
    max_active_runs=1,
    doc_md=__doc__,
    tags=["enrichment"],
    default_args={{"retries": {retries}, "retry_delay": timedelta(minutes=1)}},
) as dag:
    ingest = PythonOperator(
        task_id="ingest", python_callable=run_enrich, op_args=[CONFIG, "ingest", *RUN_ARGS]
    )
    stages = [
        PythonOperator(
            task_id=f"stage_{{stage}}",
            python_callable=run_enrich,
            op_args=[CONFIG, "stage", stage, *RUN_ARGS],
        )
        for stage in STAGES
    ]
    validate = PythonOperator(
        task_id="validate", python_callable=run_enrich, op_args=[CONFIG, "validate", *RUN_ARGS]
    )
    chain(ingest, *stages, validate)
'''
QUALITY_TEMPLATE = '''"""
### Daily data-quality report of pipeline `{name}`

Generated from the pipeline config by
`enrich --config {config_rel} generate-dag --out {pipeline_out_rel}`;
regenerate it instead of editing it.

Once a day, renders the HTML run report (cache hit rate, pending state, master bytes
read, rows in/out/quarantined, validation pass/fail) of the day's runs into the
warehouse's `_reports/` folder, and fails when a run of that day left a quarantined output
batch nobody resolved (`enrich resolve TABLE --run-id R [--publish]`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, DeltaDataIntervalTimetable

from orchestration.airflow_tasks import run_enrich

CONFIG = str(Path(__file__).resolve().parent.parent / {config_literal})
START = datetime({start_args}, tzinfo=UTC)

with DAG(
    dag_id="quality_report_{name}",
    schedule=DeltaDataIntervalTimetable(timedelta(days=1)),
    start_date=START,
    catchup={catchup},
    max_active_runs=1,
    doc_md=__doc__,
    tags=["enrichment", "quality"],
    default_args={{"retries": 0}},
) as dag:
    PythonOperator(
        task_id="report",
        python_callable=run_enrich,
        op_args=[
            CONFIG,
            "report",
            "--start",
            "{{{{ data_interval_start.isoformat() }}}}",
            "--end",
            "{{{{ data_interval_end.isoformat() }}}}",
            "--fail-on-unresolved",
        ],
    )
'''


def quality_dag_path(config: PipelineConfig, dag_path: Path) -> Path:
    """The daily quality-report DAG is written beside the pipeline DAG."""
    return dag_path.parent / f"quality_report_{config.name}.py"


def _common_fields(config: PipelineConfig, config_path: Path, dag_path: Path) -> dict[str, Any]:
    start = config.schedule.start
    repo_root = dag_path.resolve().parent.parent
    config_rel = os.path.relpath(config_path.resolve(), repo_root)
    return {
        "name": config.name,
        "config_rel": config_rel,
        "config_literal": json.dumps(config_rel),
        "start_args": ", ".join(
            str(v) for v in (start.year, start.month, start.day, start.hour, start.minute)
        ),
        "catchup": config.schedule.catchup,
    }


def render_dag(config: PipelineConfig, config_path: Path, dag_path: Path) -> str:
    repo_root = dag_path.resolve().parent.parent
    return TEMPLATE.format(
        **_common_fields(config, config_path, dag_path),
        out_rel=os.path.relpath(dag_path.resolve(), repo_root),
        stage_list="\n".join(f"- `{s.name}` ({s.kind})" for s in config.stages) or "none",
        stages=_tuple_literal([s.name for s in config.stages]),
        interval_seconds=int(config.schedule.interval_delta.total_seconds()),
        retries=config.schedule.retries,
    )


def render_quality_dag(config: PipelineConfig, config_path: Path, dag_path: Path) -> str:
    """``dag_path`` is the pipeline DAG's path; the report DAG goes beside it."""
    repo_root = dag_path.resolve().parent.parent
    return QUALITY_TEMPLATE.format(
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
