"""Shared fixtures: one embedded Spark session for the whole test run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from warehouse.spark import SparkSettings, build_session

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        SparkSettings(
            app_name="tests",
            master="local[2]",
            conf={
                "spark.sql.shuffle.partitions": "2",
                "spark.default.parallelism": "2",
                "spark.ui.enabled": "false",
                "spark.driver.memory": "2g",
                "spark.sql.adaptive.enabled": "false",
            },
        )
    )
    yield session
    session.stop()
