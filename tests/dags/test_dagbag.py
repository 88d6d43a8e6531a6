"""The DAG files parse fast, cleanly, without heavy imports, and match their configs."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config
from pipeline.dag_generator import quality_dag_path, render_dag, render_quality_dag
from tests.conftest import REPO_ROOT
from tests.helpers import assert_imports_none_of

DAGS = REPO_ROOT / "dags"


def config_outputs() -> list[str]:
    return load_config(REPO_ROOT / "configs" / "demo.yaml").outputs()


def test_dagbag_imports_without_errors_in_under_two_seconds(airflow_home: Path) -> None:
    import airflow  # noqa: F401 - warm the Airflow import itself; parse time is measured below
    from airflow.dag_processing.dagbag import DagBag

    started = time.perf_counter()
    bag = DagBag(dag_folder=str(DAGS))
    elapsed = time.perf_counter() - started
    assert bag.import_errors == {}
    assert elapsed < 2.0, f"parsing {DAGS} took {elapsed:.2f}s"
    dag = bag.get_dag("enrich_demo")
    assert dag is not None
    assert dag.catchup is False and dag.max_active_runs == 1
    assert dag.doc_md and "Stages" in dag.doc_md and "`orders_customer` (equi)" in dag.doc_md
    live = ["ingest", "stage_orders_customer", "stage_orders_promotions"]
    live += ["stage_lineitem_partsupp", "validate"]
    # route -> the live path in config order, or -> backfill (runs of type backfill)
    assert dag.get_task("route").downstream_task_ids == {"ingest", "backfill"}
    for upstream, downstream in itertools.pairwise(live):
        assert dag.get_task(upstream).downstream_task_ids == {downstream}
    assert dag.get_task("backfill").downstream_task_ids == set()
    # Each published table is an Asset that a successful validate or backfill updates.
    published = [
        "enrich://demo/gold/lineitem_suppliers",
        "enrich://demo/gold/orders_customer",
        "enrich://demo/gold/orders_enriched",
    ]
    for task_id in ("validate", "backfill"):
        assert sorted(a.uri for a in dag.get_task(task_id).outlets) == published
    # ... and a second Asset per table, updated by its own task after validate only when an
    # interval of the table became complete.
    complete = {f"complete_{t}": f"enrich://demo/gold/{t}/complete" for t in config_outputs()}
    assert dag.get_task("validate").downstream_task_ids == set(complete)
    for task_id, uri in complete.items():
        assert [a.uri for a in dag.get_task(task_id).outlets] == [uri]
        assert dag.get_task(task_id).downstream_task_ids == set()
    with_outlets = {"validate", "backfill", *complete}
    assert all(not t.outlets for t in dag.tasks if t.task_id not in with_outlets)
    # Every Spark task takes a slot of the pool; the router and the complete tasks start
    # no Spark.
    assert {t.task_id for t in dag.tasks if t.pool == "enrich_spark"} == {*live, "backfill"}
    assert set(dag.params) == {"steps", "drain"}
    assert dag.params["drain"] is False and dag.params["steps"] is None
    # A hung Spark job fails its task after schedule.task_timeout (2h by default).
    assert {t.execution_timeout for t in dag.tasks} == {timedelta(hours=2)}
    report = bag.get_dag("quality_report_demo")
    assert report is not None and report.doc_md
    assert [t.task_id for t in report.tasks] == ["report"]
    # The report runs when an interval of any published table became complete.
    condition = report.timetable.asset_condition
    assert type(condition).__name__ == "AssetAny", condition
    assert sorted(a.uri for a in condition.objects) == sorted(complete.values())


@pytest.mark.parametrize("dag_file", sorted(DAGS.glob("*.py")), ids=lambda p: p.name)
def test_parsing_a_dag_imports_neither_spark_nor_gx(airflow_home: Path, dag_file: Path) -> None:
    assert_imports_none_of(
        f"import runpy\nrunpy.run_path({str(dag_file)!r})",
        ("pyspark", "great_expectations", "deltalake", "duckdb", "matplotlib"),
        REPO_ROOT,
    )


@pytest.mark.parametrize("dag_file", sorted(DAGS.glob("enrich_*.py")), ids=lambda p: p.name)
def test_generated_dags_are_up_to_date(dag_file: Path) -> None:
    config_path = REPO_ROOT / "configs" / f"{dag_file.stem.removeprefix('enrich_')}.yaml"
    config = load_config(config_path)
    report_file = quality_dag_path(config, dag_file)
    command = f"enrich --config {config_path.relative_to(REPO_ROOT)} generate-dag"
    stale = f"is stale: run {command} --out {dag_file.relative_to(REPO_ROOT)}"
    assert dag_file.read_text() == render_dag(config, config_path, dag_file), (
        f"{dag_file.name} {stale}"
    )
    assert report_file.read_text() == render_quality_dag(config, config_path, dag_file), (
        f"{report_file.name} {stale}"
    )


def test_a_schedule_with_an_end_gives_the_dag_that_end_date(
    airflow_home: Path, tmp_path: Path
) -> None:
    """``schedule.end`` becomes the DAG's ``end_date``: the scheduler creates no run for an
    interval starting after it; without it the DAG has none (the committed DAGs)."""
    from airflow.dag_processing.dagbag import DagBag

    raw = yaml.safe_load((REPO_ROOT / "configs" / "demo.yaml").read_text())
    raw["schedule"] |= {"start": "2024-01-01T00:00:00", "end": "2024-01-03T05:00:00"}
    config_path = tmp_path / "configs" / "demo.yaml"
    config_path.parent.mkdir()
    config_path.write_text(yaml.safe_dump(raw))
    dag_path = tmp_path / "dags" / "enrich_demo.py"
    dag_path.parent.mkdir()
    dag_path.write_text(render_dag(load_config(config_path), config_path, dag_path))
    bag = DagBag(dag_folder=str(dag_path.parent))
    assert bag.import_errors == {}
    dag = bag.get_dag("enrich_demo")
    assert dag is not None and dag.end_date == datetime(2024, 1, 3, 5, tzinfo=UTC)
    committed = DagBag(dag_folder=str(DAGS / "enrich_demo.py"))
    assert committed.get_dag("enrich_demo").end_date is None
