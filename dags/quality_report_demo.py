"""
### Data-quality report of pipeline `demo`, once intervals are complete

Generated from the pipeline config by
`enrich --config configs/demo.yaml generate-dag --out dags/enrich_demo.py`;
regenerate it instead of editing it.

Scheduled on the pipeline's `complete` Assets (`enrich://demo/gold/<table>/complete`,
updated only when an interval of the table became complete: none of its tuples waits in
the table's chain any more), so it reports on complete intervals only: each time one is
updated, renders the HTML run report (completeness per interval, cache hit rate, pending
state, master bytes read, rows in/out/quarantined, validation pass/fail) of the intervals
completed and the data intervals of the runs that completed them (a manual run: the day
before it) into the warehouse's `_reports/` folder, and fails when one of those runs left a
quarantined output batch nobody resolved (`enrich resolve TABLE --run-id R [--publish]`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, AssetAny

from orchestration.airflow_tasks import run_report
from orchestration.assets import complete_assets

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/demo.yaml")
START = datetime(2024, 1, 1, 0, 0, tzinfo=UTC)
OUTPUTS = ("orders_customer", "orders_enriched", "lineitem_suppliers")
COMPLETE = complete_assets("demo", OUTPUTS)

with DAG(
    dag_id="quality_report_demo",
    schedule=AssetAny(*COMPLETE),
    start_date=START,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["enrichment", "quality"],
    default_args={"retries": 0},
) as dag:
    PythonOperator(task_id="report", python_callable=run_report, op_args=[CONFIG])
