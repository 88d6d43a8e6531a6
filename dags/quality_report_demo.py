"""
### Daily data-quality report of pipeline `demo`

Generated from the pipeline config by
`enrich --config configs/demo.yaml generate-dag --out dags/enrich_demo.py`;
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

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/demo.yaml")
START = datetime(2024, 1, 1, 0, 0, tzinfo=UTC)

with DAG(
    dag_id="quality_report_demo",
    schedule=DeltaDataIntervalTimetable(timedelta(days=1)),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["enrichment", "quality"],
    default_args={"retries": 0},
) as dag:
    PythonOperator(
        task_id="report",
        python_callable=run_enrich,
        op_args=[
            CONFIG,
            "report",
            "--start",
            "{{ data_interval_start.isoformat() }}",
            "--end",
            "{{ data_interval_end.isoformat() }}",
            "--fail-on-unresolved",
        ],
    )
