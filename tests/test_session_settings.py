"""The shared Spark session's runtime settings are restored after each test
(``tests/conftest.py``'s ``session_settings_restored``): a command run in-process applies
its config's settings to the running session, and the next test must not inherit them.

The two tests run in this order in one process (a file is never split between workers).
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipeline.config import load_config
from tests.conftest import REPO_ROOT
from warehouse.spark import SparkSettings, build_session

DEMO = REPO_ROOT / "configs" / "demo.yaml"


def test_an_in_process_command_applies_its_config_to_the_running_session(
    spark: SparkSession,
) -> None:
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
    # What a command run in-process does with its config's `spark:` section.
    conf = load_config(DEMO).spark.conf
    assert build_session(SparkSettings(master="local[2]", conf=conf)) is spark
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"  # the demo config's


def test_the_next_test_finds_the_session_as_the_fixture_made_it(spark: SparkSession) -> None:
    assert spark.conf.get("spark.sql.shuffle.partitions") == "2"
