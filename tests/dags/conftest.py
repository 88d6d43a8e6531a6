"""An isolated Airflow home (SQLite metadata DB) for the DAG tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestration.airflow_env import prepare_airflow_home


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("airflow")
    prepare_airflow_home(home)
    yield home
