"""The Spark master and the state store from Airflow connections, and their precedence."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from common.errors import ConfigError
from orchestration.airflow_tasks import (
    STATE_STORE_ENV,
    connection_settings,
    route_run,
    stage_options,
)
from orchestration.connections import (
    ConnectionFields,
    lookup,
    object_store_environment,
    spark_master_url,
    state_store_url,
)


@pytest.mark.parametrize(
    ("host", "port", "expected"),
    [
        ("spark-master", 7077, "spark://spark-master:7077"),
        ("spark-master", None, "spark://spark-master:7077"),
        ("spark://10.0.0.5", 7177, "spark://10.0.0.5:7177"),
        ("spark://10.0.0.5:7000", 7177, "spark://10.0.0.5:7000"),
        ("yarn", None, "yarn"),
        ("local[4]", None, "local[4]"),
        ("k8s://https://api:6443", None, "k8s://https://api:6443"),
    ],
)
def test_spark_master_urls_as_the_spark_provider_writes_connections(
    host: str, port: int | None, expected: str
) -> None:
    assert spark_master_url(ConnectionFields("enrich_spark", "spark", host, port)) == expected


def test_a_connection_of_the_wrong_kind_or_without_a_host_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'enrich_spark': expected conn_type 'spark'.*'http'"):
        spark_master_url(ConnectionFields("enrich_spark", "http", "h"))
    with pytest.raises(ConfigError, match="expected the Spark master in its host"):
        spark_master_url(ConnectionFields("enrich_spark", "spark", None))
    with pytest.raises(ConfigError, match=r"expected conn_type 'postgres'.*'sqlite'"):
        state_store_url(ConnectionFields("enrich_state_store", "sqlite", "h", schema="d"))
    with pytest.raises(ConfigError, match="expected a host and a schema"):
        state_store_url(ConnectionFields("enrich_state_store", "postgres", "h"))


def test_the_state_store_url_uses_psycopg_and_quotes_the_password() -> None:
    fields = ConnectionFields("s", "postgres", "db.internal", 5433, "enrich", "p@ss:w/rd", "state")
    assert state_store_url(fields) == (
        "postgresql+psycopg://enrich:p%40ss%3Aw%2Frd@db.internal:5433/state"
    )


def test_connections_come_from_airflow_and_give_way_to_the_environment(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Set, then removed, through monkeypatch: it restores the variables' absence afterwards,
    # whatever connection_settings wrote into os.environ in between (a leaked
    # ENRICH_STATE_STORE would point every later test of this worker at that store).
    for name in ("SPARK_MASTER", STATE_STORE_ENV):
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    assert lookup("enrich_spark") is None  # not defined: the config decides
    assert connection_settings(["ingest"]) == []
    monkeypatch.setenv("AIRFLOW_CONN_ENRICH_SPARK", "spark://spark-master:7177")
    monkeypatch.setenv("AIRFLOW_CONN_ENRICH_STATE_STORE", "postgres://u:pw@db:5432/state")

    assert connection_settings(["ingest"]) == ["--master", "spark://spark-master:7177"]
    import os

    assert os.environ[STATE_STORE_ENV] == "postgresql+psycopg://u:pw@db:5432/state"
    # The command line and the environment win over the connections.
    assert connection_settings(["--master", "local[1]", "ingest"]) == []
    monkeypatch.setenv("SPARK_MASTER", "spark://elsewhere:7077")
    monkeypatch.setenv(STATE_STORE_ENV, "sqlite:///kept.db")
    assert connection_settings(["ingest"]) == []
    assert os.environ[STATE_STORE_ENV] == "sqlite:///kept.db"


def test_the_object_store_connection_becomes_aws_variables_and_bad_ones_are_refused() -> None:
    fields = ConnectionFields(
        "enrich_object_store",
        "aws",
        login="AKIDEXAMPLE",
        password="s3cr3t/key+x",
        extra={"endpoint_url": "http://127.0.0.1:8333", "region_name": "eu-west-1"},
    )
    assert object_store_environment(fields) == {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t/key+x",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:8333",
        "AWS_REGION": "eu-west-1",
    }
    # No keys: the AWS SDK's own providers (an instance role) decide.
    assert object_store_environment(ConnectionFields("o", "aws")) == {}
    with pytest.raises(ConfigError, match=r"expected conn_type 'aws'.*'postgres'"):
        object_store_environment(ConnectionFields("o", "postgres", login="a", password="b"))
    with pytest.raises(ConfigError, match="expected both login"):
        object_store_environment(ConnectionFields("o", "aws", login="only-the-id"))


def test_the_object_store_connection_gives_way_to_the_environment(
    airflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from common.secrets import redact

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    monkeypatch.setenv(
        "AIRFLOW_CONN_ENRICH_OBJECT_STORE",
        '{"conn_type": "aws", "login": "AKIDTASK", "password": "task-secret-value", '
        '"extra": {"endpoint_url": "http://127.0.0.1:9000", "region_name": "us-east-2"}}',
    )
    connection_settings(["ingest"])
    assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIDTASK"
    assert os.environ["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert os.environ["AWS_REGION"] == "us-east-2"
    assert "task-secret-value" not in redact("key task-secret-value in a message")
    # A worker's own keys win over the connection.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDOWN")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "own-secret")
    connection_settings(["ingest"])
    assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIDOWN"


def test_params_become_stage_options_and_bad_ones_are_refused() -> None:
    assert stage_options(None) == []
    assert stage_options({"steps": None, "drain": False}) == []
    assert stage_options({"steps": 3, "drain": True}) == ["--steps", "3", "--drain"]
    for bad in ({"steps": 0}, {"steps": True}, {"steps": "2"}, {"drain": "yes"}):
        with pytest.raises(Exception, match=r"param (steps|drain): expected"):
            stage_options(bad)


class _Run:
    def __init__(self, run_type: str) -> None:
        self.run_type, self.run_id = run_type, f"{run_type}__x"


def test_backfill_runs_take_the_backfill_path() -> None:
    assert route_run(_Run("backfill")) == "backfill"
    for live in ("scheduled", "manual", "asset_triggered"):
        assert route_run(_Run(live)) == "ingest"


def test_the_task_callable_and_the_config_name_the_same_variable() -> None:
    from pipeline.config import STATE_STORE_ENV as CONFIG_ENV

    assert STATE_STORE_ENV == CONFIG_ENV


def test_the_demo_airflow_home_creates_the_pool_the_config_names_by_default() -> None:
    from orchestration.airflow_env import DEFAULT_POOL
    from pipeline.config import ScheduleConfig

    assert ScheduleConfig().pool == DEFAULT_POOL


class _SourceRun:
    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.data_interval_start, self.data_interval_end = start, end


class _Event:
    def __init__(self, run: _SourceRun | None, extra: dict[str, Any] | None = None) -> None:
        self.source_dag_run = run
        self.extra = extra or {}


def test_the_quality_report_covers_the_intervals_of_the_runs_that_published() -> None:
    from orchestration.airflow_tasks import report_range

    hour = dt.timedelta(hours=1)
    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    events = {
        "enrich://demo/gold/a": [_Event(_SourceRun(t0, t0 + hour))],
        "enrich://demo/gold/b": [_Event(_SourceRun(t0 + hour, t0 + 2 * hour)), _Event(None)],
    }
    assert report_range(None, events) == (t0, t0 + 2 * hour)
    # A complete event names the intervals it completed: an earlier run's is covered too.
    earlier = {
        "intervals": [{"interval_start": (t0 - hour).isoformat(), "interval_end": t0.isoformat()}]
    }
    events["enrich://demo/gold/a/complete"] = [
        _Event(_SourceRun(t0 + hour, t0 + 2 * hour), earlier)
    ]
    assert report_range(None, events) == (t0 - hour, t0 + 2 * hour)

    class _Manual:
        run_after = t0 + 5 * hour

    assert report_range(_Manual(), {}) == (t0 + 5 * hour - dt.timedelta(days=1), t0 + 5 * hour)


def test_the_run_s_identity_becomes_options_unless_given() -> None:
    from orchestration.airflow_tasks import run_options

    t0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(hours=1)
    assert run_options(["ingest"], "r1", t0, t1) == [
        *("--run-id", "r1", "--start", t0.isoformat(), "--end", t1.isoformat())
    ]
    # A run triggered without a logical date has no data interval: no --start/--end.
    assert run_options(["ingest"], "manual__x", None, None) == ["--run-id", "manual__x"]
    assert run_options(["ingest", "--run-id", "mine"], "r1", None, None) == []
