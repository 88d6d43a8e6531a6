"""A pipeline whose first batch was run, audited and published; tests work on copies."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.quality.audit_harness import FIRST_BATCH, arrive_and_run, quality_harness, validate


@pytest.fixture(scope="session")
def base(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("base")
    h = quality_harness(spark, root)
    arrive_and_run(h, FIRST_BATCH, "r1")
    assert validate(h, "r1") == 0
    h.store.dispose()
    return root
