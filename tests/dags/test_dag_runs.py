"""``dag.test()`` of the demo DAG over consecutive intervals, checked against DuckDB."""

from __future__ import annotations

import datetime as dt
import json
import logging
from pathlib import Path

import duckdb
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from demo.data import deliver
from jobs.enrich import main as enrich
from pipeline.config import load_config
from pipeline.layout import WarehouseLayout
from tests.conftest import REPO_ROOT
from tests.demo_oracle import (
    ENRICHED_COLUMNS,
    delta_rows,
    enriched_orders,
    load_orders,
    oracle_rows,
)
from tests.helpers import assert_same_multiset

pytestmark = pytest.mark.slow

CONFIG = REPO_ROOT / "configs" / "demo.yaml"
INTERVALS = 2


class CommandLines(logging.Handler):
    """The ``enrich ...`` command lines the DAG's tasks log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_dag_runs_match_duckdb_oracle(
    airflow_home: Path, spark: SparkSession, workdir: Path
) -> None:
    assert (
        enrich(
            ["--config", str(CONFIG), "demo-data", "--scale", "0.01", "--intervals", str(INTERVALS)]
        )
        == 0
    )
    config = load_config(CONFIG)
    layout = WarehouseLayout.of(config)
    outbox = Path(config.warehouse.root).parent / "outbox"
    manifest = json.loads((outbox / "manifest.json").read_text())

    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).get_dag("enrich_demo")
    assert dag is not None
    commands = CommandLines()
    task_logger = logging.getLogger("orchestration.airflow_tasks")
    task_logger.addHandler(commands)
    task_logger.setLevel(logging.INFO)
    try:
        for index, start in enumerate(manifest["intervals"]):
            for stream in manifest["streams"]:
                deliver(outbox, stream, index, Path(config.streams[stream].landing))
            end = dt.datetime.fromisoformat(start).replace(tzinfo=dt.UTC) + dt.timedelta(hours=1)
            # The last run is a manual run's conf: the stage tasks take its params as
            # options (drain, so every tuple is still answered in this run).
            conf = {"steps": 1, "drain": True} if index == INTERVALS - 1 else None
            run = dag.test(logical_date=end, run_conf=conf)
            assert str(run.state).endswith("success"), f"interval {index} ended {run.state}"
    finally:
        task_logger.removeHandler(commands)
    # By default every task sends its command to the pipeline's warm worker.
    enrich_lines = [line for line in commands.lines if line.startswith("enrich ")]
    assert enrich_lines and all(line.startswith("enrich --worker ") for line in enrich_lines)
    stage_commands = [line for line in enrich_lines if line.startswith("enrich --worker stage ")]
    assert len(stage_commands) == len(config.stages) * INTERVALS, commands.lines
    with_params = [line for line in stage_commands if line.endswith("--steps 1 --drain")]
    assert len(with_params) == len(config.stages), stage_commands
    # The pipeline's own INFO lines get through Airflow's logging: Airflow's root handler
    # (at WARNING in this Airflow home) was lowered to the commands' INFO. Checked on the
    # handlers themselves: which stream they write to depends on when this process first
    # configured Airflow (another test of the same worker may have), so output capture is
    # no witness.
    airflow_handlers = [
        h for h in logging.getLogger().handlers if not type(h).__module__.startswith("_pytest")
    ]
    assert airflow_handlers, "Airflow installed no root handler"
    assert all(h.level <= logging.INFO for h in airflow_handlers), [
        (type(h).__name__, h.level) for h in airflow_handlers
    ]
    record = logging.LogRecord("pipeline.runner", logging.INFO, __file__, 0, "probe", (), None)
    assert all(h.filter(record) for h in airflow_handlers)
    # Each run's successful validate updated every published table's Asset once, and,
    # each run answering all of its interval, the table's complete Asset too, naming it.
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        updated = session.query(AssetModel.uri, AssetEvent.extra).join(
            AssetEvent, AssetEvent.asset_id == AssetModel.id
        )
        events = [(uri, dict(extra or {})) for uri, extra in updated]
    published = sorted(f"enrich://demo/gold/{stage.output}" for stage in config.stages)
    complete = [f"{uri}/complete" for uri in published]
    assert sorted(uri for uri, _ in events) == sorted((published + complete) * INTERVALS)
    completed: dict[str, list[str]] = {}
    for uri, extra in events:
        if uri.endswith("/complete"):
            completed.setdefault(uri, []).extend(i["interval_start"] for i in extra["intervals"])
        else:
            assert extra["complete"] is True and extra["share_answered"] == 1.0, (uri, extra)
    starts = [dt.datetime.fromisoformat(s).replace(tzinfo=dt.UTC) for s in manifest["intervals"]]
    assert completed == {uri: [s.isoformat() for s in starts] for uri in complete}

    con = duckdb.connect()
    masters = {n: DeltaTable(layout.master(config, n)).to_pyarrow_table() for n in config.masters}
    versions = {name: DeltaTable(layout.master(config, name)).version() for name in config.masters}
    con.register("partsupp", masters["partsupp"])
    landing = {name: config.streams[name].landing for name in config.streams}
    assert load_orders(con, f"{landing['orders']}/*.json") == 15000
    con.execute(
        f"""CREATE TABLE lineitem AS SELECT * FROM read_json('{landing["lineitem"]}/*.json',
        format='newline_delimited', columns={{l_id: 'BIGINT', l_orderkey: 'BIGINT',
        l_partkey: 'BIGINT', l_quantity: 'DOUBLE', l_extendedprice: 'DOUBLE',
        event_time: 'TIMESTAMP'}})"""
    )
    assert_same_multiset(
        delta_rows(layout.staged("orders_enriched"), ENRICHED_COLUMNS),
        enriched_orders(con, masters, versions),
    )

    supplier_columns = [
        "l_id",
        "l_partkey",
        "l_quantity",
        "ps_suppkey",
        "ps_supplycost",
        "_version_partsupp",
    ]
    expected_suppliers = oracle_rows(
        con,
        f"""SELECT l.l_id, l.l_partkey, l.l_quantity, ps.ps_suppkey, ps.ps_supplycost,
                   {versions["partsupp"]}
        FROM lineitem l JOIN partsupp ps ON l.l_partkey = ps.ps_partkey""",
    )
    assert len(expected_suppliers) == 4 * con.execute("SELECT count(*) FROM lineitem").fetchone()[0]
    assert_same_multiset(
        delta_rows(layout.staged("lineitem_suppliers"), supplier_columns), expected_suppliers
    )

    # Every batch passed its suite: the published tables hold exactly the staged rows.
    for stage in config.stages:
        columns = DeltaTable(layout.staged(stage.output)).schema().to_arrow().names
        assert_same_multiset(
            delta_rows(layout.published(stage.output), columns),
            delta_rows(layout.staged(stage.output), columns),
        )
    results = DeltaTable(layout.quality_results()).to_pyarrow_table().to_pylist()
    assert {r["table"] for r in results} == {s.output for s in config.stages}
    assert all(r["success"] for r in results), [r for r in results if not r["success"]][:3]

    # The quality report DAG (scheduled on the published Assets; run by hand here, so it
    # covers the day before its run) renders the report and passes: nothing unresolved.
    report_dag = DagBag(dag_folder=str(REPO_ROOT / "dags")).get_dag("quality_report_demo")
    assert report_dag is not None
    last_start = dt.datetime.fromisoformat(manifest["intervals"][-1]).replace(tzinfo=dt.UTC)
    day_end = dt.datetime.combine(last_start.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
    run = report_dag.test(run_after=day_end, logical_date=None)
    assert str(run.state).endswith("success")
    reports = list(Path(layout.reports()).glob("run-report_*.html"))
    assert len(reports) == 1 and "<svg" in reports[0].read_text()
