"""The Airflow task callable: which exit codes fail a task for good, which are retried.

Airflow is imported inside the tests, after the ``airflow_home`` fixture: an import at
collection time would configure Airflow for every test of this process without its home.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from orchestration.airflow_tasks import EnrichTaskError, run_enrich
from pipeline.config import load_config
from tests.helpers import tiny_pipeline
from warehouse.lease import LeaseSettings, PipelineLease
from warehouse.state_store import StateStore


def test_a_config_error_fails_the_task_without_retries(airflow_home: Path, tmp_path: Path) -> None:
    from airflow.sdk.exceptions import AirflowFailException  # after airflow_home: see conftest

    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nstreams: {}\n")
    with pytest.raises(AirflowFailException, match=r"exited with code 2 \(bad configuration\)"):
        run_enrich(str(broken), "ingest", "--run-id", "r1")


def test_a_busy_lease_is_an_ordinary_failure_that_airflow_retries(
    airflow_home: Path, spark: SparkSession, tmp_path: Path
) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    config_file = tmp_path / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(tiny_pipeline(tmp_path, "k", "bigint")))
    store = StateStore(load_config(config_file).warehouse.resolved_state_store())
    holder = PipelineLease(store, "t", "run other", LeaseSettings(ttl_seconds=30))
    holder.acquire()
    try:
        with pytest.raises(EnrichTaskError, match="exited with code 5") as raised:
            run_enrich(str(config_file), "ingest", "--run-id", "r1")
        assert not isinstance(raised.value, AirflowFailException)
    finally:
        holder.release()
        store.dispose()
