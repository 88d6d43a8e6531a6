"""The cluster figures ``scheme: auto`` reads from a session (warehouse/spark.py)."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from common.errors import ConfigError
from warehouse.spark import DEFAULT_BROADCAST_BYTES, broadcast_threshold, parallelism

KEY = "spark.sql.autoBroadcastJoinThreshold"


@pytest.mark.parametrize(
    ("value", "expected"),
    [("10485760", 10485760.0), ("10m", 10 * 1024 * 1024.0), ("2g", 2 * 1024**3.0), ("-1", 0.0)],
)
def test_broadcast_threshold_reads_bytes_and_units(
    spark: SparkSession, value: str, expected: float
) -> None:
    previous = spark.conf.get(KEY)
    spark.conf.set(KEY, value)
    try:
        assert broadcast_threshold(spark) == expected
    finally:
        spark.conf.set(KEY, previous)


def test_the_default_threshold_is_sparks(spark: SparkSession) -> None:
    previous = spark.conf.get(KEY)
    spark.conf.unset(KEY)
    try:
        assert broadcast_threshold(spark) == float(DEFAULT_BROADCAST_BYTES)
    finally:
        spark.conf.set(KEY, previous)


def test_parallelism_is_the_local_cores(spark: SparkSession) -> None:
    assert parallelism(spark) == spark.sparkContext.defaultParallelism == 2


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)


class _Session:
    """Only the conf: the parse, not Spark, is under test here."""

    def __init__(self, values: dict[str, str]) -> None:
        self.conf = _Conf(values)


def test_an_unreadable_threshold_names_the_key_and_the_value() -> None:
    with pytest.raises(ConfigError, match=r"autoBroadcastJoinThreshold is 'ten megabytes'"):
        broadcast_threshold(_Session({KEY: "ten megabytes"}))  # type: ignore[arg-type]


def test_the_master_comes_from_the_command_line_then_the_environment_then_the_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from warehouse.spark import DEFAULT_MASTER, effective_master

    monkeypatch.delenv("SPARK_MASTER", raising=False)
    assert effective_master(None, None) == DEFAULT_MASTER
    assert effective_master(None, "local[4]") == "local[4]"
    monkeypatch.setenv("SPARK_MASTER", "spark://env:7077")
    assert effective_master(None, "local[4]") == "spark://env:7077"
    assert effective_master("spark://cli:7077", "local[4]") == "spark://cli:7077"
