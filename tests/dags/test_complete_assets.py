"""``dag.test()`` of a generated DAG whose SSBJ stage holds tuples across two runs: the gold
Asset event of every validate says whether its interval is complete, and the ``complete``
Asset is updated only by the run that completed an interval (its task is skipped before).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.sql import SparkSession

from pipeline.dag_generator import write_dag
from pipeline.layout import WarehouseLayout
from tests.pipeline.ssbj_harness import MASTER_SCHEMA, config_for
from warehouse.delta import open_engine

I0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
HOUR = dt.timedelta(hours=1)
LOCAL_BUNDLE = "airflow.dag_processing.bundles.local.LocalDagBundle"
GOLD, COMPLETE = "enrich://t/gold/out", "enrich://t/gold/out/complete"


def asset_events() -> list[tuple[str, dict[str, Any]]]:
    """(URI, extra) of this pipeline's Asset events, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetModel.uri, AssetEvent.extra)
            .join(AssetEvent, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.uri.like("enrich://t/%"))
            .order_by(AssetEvent.id)
        )
        return [(uri, dict(extra or {})) for uri, extra in rows]


def task_states(run_id: str) -> dict[str, str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        found = session.query(TaskInstance.task_id, TaskInstance.state).filter(
            TaskInstance.dag_id == "enrich_t", TaskInstance.run_id == run_id
        )
        return {task: str(state) for task, state in found}


def test_the_complete_asset_waits_for_the_run_that_completes_the_interval(
    airflow_home: Path, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # k = 2 partitions, 1 step a run, freshness 2 intervals: a run answers half a cycle.
    config = config_for(
        tmp_path,
        "ssbj",
        2,
        1,
        "left",
        extra={"schedule": {"retries": 0, "worker": {"enabled": False}}},
    )
    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    dags = str(tmp_path / "dags")
    write_dag(config, config_file, tmp_path / "dags" / "enrich_t.py")
    engine = open_engine(spark, "embedded")
    master = WarehouseLayout.of(config).master(config, "m")
    engine.create_table(master, MASTER_SCHEMA)
    rows = [(k, s, float(10 * k + s)) for k in range(1, 6) for s in range(k % 3)]
    engine.append(master, spark.createDataFrame(rows, MASTER_SCHEMA).repartition(2))
    landing = Path(config.streams["s"].landing)
    landing.mkdir(parents=True)
    (landing / "i0.json").write_text(
        "".join(
            json.dumps({"id": i, "k": i % 6, "ts": f"2024-01-01T00:00:{i:02d}"}) + "\n"
            for i in range(1, 11)
        )
    )
    # dag.test() runs a DAG that a DAG bundle holds: this one's folder, beside the repo's.
    bundles = [
        {"name": "dags-folder", "classpath": LOCAL_BUNDLE, "kwargs": {}},
        {"name": "complete-assets-test", "classpath": LOCAL_BUNDLE, "kwargs": {"path": dags}},
    ]
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=dags).get_dag("enrich_t")
    assert dag is not None

    first = dag.test(logical_date=I0 + HOUR)  # the data interval [I0, I0 + 1h)
    assert str(first.state).endswith("success")
    states = task_states(first.run_id)
    assert states["validate"].endswith("success") and states["complete_out"].endswith("skipped")
    ((uri, extra),) = asset_events()  # the gold event only
    assert uri == GOLD
    assert (extra["interval_start"], extra["complete"]) == (I0.isoformat(), False)
    assert extra["share_answered"] < 1.0 and extra["tuples"] == 10
    assert extra["completed_intervals"] == []

    second = dag.test(logical_date=I0 + 2 * HOUR)  # the next interval: no new tuples
    assert str(second.state).endswith("success")
    assert task_states(second.run_id)["complete_out"].endswith("success")
    events = asset_events()[1:]
    assert [uri for uri, _ in events] == [GOLD, COMPLETE]
    gold, complete = events[0][1], events[1][1]
    assert (gold["interval_start"], gold["complete"]) == ((I0 + HOUR).isoformat(), True)
    # The first interval, left incomplete by the first run, completed by this one (with
    # this run's own, empty, interval).
    assert gold["completed_intervals"] == [I0.isoformat(), (I0 + HOUR).isoformat()]
    assert complete["run_id"] == second.run_id
    assert [(i["interval_start"], i["tuples"]) for i in complete["intervals"]] == [
        (I0.isoformat(), 10),
        ((I0 + HOUR).isoformat(), 0),
    ]
