"""
### Enrichment pipeline `demo`

Generated from the pipeline config by
`enrich --config configs/demo.yaml generate-dag --out dags/enrich_demo.py`;
regenerate it instead of editing it.

Every interval: **ingest** the complete landing files, run one step of each **stage** in
config order, then **validate**: audit each output batch against its Great Expectations
suites and publish it to `gold/`, or quarantine it and fail the run. Stages:
- `orders_customer` (equi)
- `orders_promotions` (theta)
- `lineitem_partsupp` (equi)

Each task calls the `enrich` CLI with the run id and the data interval, so the same work
runs without Airflow. Backfills: `enrich backfill --start ... --end ...`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Asset, DeltaDataIntervalTimetable, chain

from orchestration.airflow_tasks import run_enrich

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/demo.yaml")
STAGES = ("orders_customer", "orders_promotions", "lineitem_partsupp")
# Each published table is an Asset, updated when `validate` succeeds (every batch of the run
# published): downstream DAGs schedule on them.
PUBLISHED = [
    Asset(
        name=f"enrich_demo.{table}",
        uri=f"enrich://demo/gold/{table}",
        group="enrichment",
    )
    for table in ("orders_customer", "orders_enriched", "lineitem_suppliers")
]
INTERVAL = timedelta(seconds=3600)
START = datetime(2024, 1, 1, 0, 0, tzinfo=UTC)
RUN_ARGS = [
    "--run-id",
    "{{ run_id }}",
    "--start",
    "{{ data_interval_start.isoformat() }}",
    "--end",
    "{{ data_interval_end.isoformat() }}",
]

with DAG(
    dag_id="enrich_demo",
    schedule=DeltaDataIntervalTimetable(INTERVAL),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["enrichment"],
    default_args={
        "retries": 0,
        "retry_delay": timedelta(minutes=1),
        "execution_timeout": timedelta(seconds=7200),
    },
) as dag:
    ingest = PythonOperator(
        task_id="ingest", python_callable=run_enrich, op_args=[CONFIG, "ingest", *RUN_ARGS]
    )
    stages = [
        PythonOperator(
            task_id=f"stage_{stage}",
            python_callable=run_enrich,
            op_args=[CONFIG, "stage", stage, *RUN_ARGS],
        )
        for stage in STAGES
    ]
    validate = PythonOperator(
        task_id="validate",
        python_callable=run_enrich,
        op_args=[CONFIG, "validate", *RUN_ARGS],
        outlets=PUBLISHED,
    )
    chain(ingest, *stages, validate)
