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

Each published table has two Assets. `enrich://demo/gold/<table>` is updated by every
successful `validate`; its event's `extra` says whether the run's interval is complete
(none of its tuples waits in the table's chain) and the share answered and published. Then
one `complete_<table>` task per table updates `enrich://demo/gold/<table>/complete`
only when an interval of the table became complete in this run (its `extra` lists those
intervals, older ones a stage's freshness bound held back included), and is skipped
otherwise: a consumer that must see whole intervals schedules on the `complete` Assets.

Each task calls the `enrich` CLI with the run id and the data interval (a run triggered
without a logical date has none), so the same work runs without Airflow. Every Spark task
takes a slot of the pool `enrich_spark` (create it with `airflow pools set enrich_spark 1
"..."`), which bounds how many Spark drivers run at once. The Spark master and the state
store come from the Airflow connections `enrich_spark` and `enrich_state_store` when the
worker's environment does not name them.

Each task sends its command to the pipeline's warm worker process (`enrich --worker`; the
first task that finds none starts it, and it exits after `schedule.worker.idle_timeout`
without a command), so Python, Spark and Great Expectations start once, not per task.

Params of a manual run: `steps` (SSBJ operator steps each stage takes this run) and
`drain` (join every pending tuple before each stage task ends).

Backfills: a run of type `backfill` (`airflow backfill create --dag-id enrich_demo
--from-date ... --to-date ...`) skips the live path and runs `enrich backfill` for its
interval: a re-join against the masters as of the interval's end that replaces the
interval atomically, audited before it is published, live offsets untouched.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from airflow.providers.standard.operators.python import BranchPythonOperator, PythonOperator
from airflow.sdk import DAG, DeltaDataIntervalTimetable, Param, chain

from orchestration.airflow_tasks import (
    announce_complete,
    route_run,
    run_enrich,
    validate_and_describe,
)
from orchestration.assets import complete_assets, published_assets

CONFIG = str(Path(__file__).resolve().parent.parent / "configs/demo.yaml")
STAGES = ("orders_customer", "orders_promotions", "lineitem_partsupp")
# Each published table is an Asset, updated when `validate` (every batch of the run
# published) or `backfill` succeeds: downstream DAGs schedule on them.
OUTPUTS = ("orders_customer", "orders_enriched", "lineitem_suppliers")
PUBLISHED = published_assets("demo", OUTPUTS)
# ... and a second Asset, updated only when an interval of the table became complete.
COMPLETE = complete_assets("demo", OUTPUTS)
POOL = "enrich_spark"
INTERVAL = timedelta(seconds=3600)
# Commands run in the pipeline's warm worker (schedule.worker.enabled).
TASK_KWARGS = {"worker": True}
# A task that runs one `enrich` command and takes a pool slot.
enrich_task = partial(PythonOperator, python_callable=run_enrich, op_kwargs=TASK_KWARGS, pool=POOL)
START = datetime(2024, 1, 1, 0, 0, tzinfo=UTC)
with DAG(
    dag_id="enrich_demo",
    schedule=DeltaDataIntervalTimetable(INTERVAL),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["enrichment"],
    params={
        "steps": Param(
            None,
            type=["null", "integer"],
            minimum=1,
            description="SSBJ steps a stage takes before its closing steps (default: scheduled)",
        ),
        "drain": Param(
            False, type="boolean", description="join every pending tuple before a stage ends"
        ),
    },
    default_args={
        "retries": 0,
        "retry_delay": timedelta(minutes=1),
        "execution_timeout": timedelta(seconds=7200),
    },
) as dag:
    route = BranchPythonOperator(task_id="route", python_callable=route_run)
    ingest = enrich_task(task_id="ingest", op_args=[CONFIG, "ingest"])
    stages = [
        enrich_task(task_id=f"stage_{stage}", op_args=[CONFIG, "stage", stage]) for stage in STAGES
    ]
    validate = PythonOperator(
        task_id="validate",
        python_callable=validate_and_describe,
        op_args=[CONFIG],
        op_kwargs=TASK_KWARGS,
        outlets=PUBLISHED,
        pool=POOL,
    )
    # Reads the state store only: no Spark, no pool slot.
    complete = [
        PythonOperator(
            task_id=f"complete_{table}",
            python_callable=announce_complete,
            op_args=[CONFIG, table],
            outlets=[asset],
        )
        for table, asset in zip(OUTPUTS, COMPLETE, strict=True)
    ]
    backfill = enrich_task(task_id="backfill", op_args=[CONFIG, "backfill"], outlets=PUBLISHED)
    chain(route, ingest, *stages, validate, complete)
    route >> backfill
