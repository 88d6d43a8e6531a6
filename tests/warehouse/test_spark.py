"""The cluster figures and size estimates ``scheme: auto`` reads from a session
(warehouse/spark.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from common.errors import ConfigError, SparkServerError
from warehouse.spark import (
    DEFAULT_BROADCAST_BYTES,
    PlanSize,
    broadcast_threshold,
    parallelism,
    parse_cost_statistics,
    plan_size,
)

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


def test_a_local_session_heartbeats_every_minute_unless_the_caller_set_the_timing(
    spark: SparkSession,
) -> None:
    from warehouse.spark import HEARTBEAT_INTERVAL, LOCAL_HEARTBEAT, session_conf

    assert spark.conf.get(HEARTBEAT_INTERVAL) == LOCAL_HEARTBEAT  # the tests' own session
    assert session_conf({}, "local[2]")[HEARTBEAT_INTERVAL] == LOCAL_HEARTBEAT
    assert session_conf({HEARTBEAT_INTERVAL: "5s"}, "local")[HEARTBEAT_INTERVAL] == "5s"
    # A shorter network timeout than the minute would make Spark refuse to start.
    assert HEARTBEAT_INTERVAL not in session_conf({"spark.network.timeout": "30s"}, "local[2]")
    # A cluster's executors are the cluster's business.
    assert HEARTBEAT_INTERVAL not in session_conf({}, "spark://h:7077")


SCHEMA = T.StructType([T.StructField("sid", T.LongType()), T.StructField("x", T.DoubleType())])


def test_plan_size_reads_the_optimizer_without_a_job(spark: SparkSession, tmp_path: Path) -> None:
    """Files: their bytes and no row count. A materialized cache: its exact rows and bytes.
    Reading either runs no Spark job."""
    frame = spark.createDataFrame([(i, i / 7) for i in range(300)], SCHEMA)
    frame.write.parquet(str(tmp_path / "t"))
    files = spark.read.parquet(str(tmp_path / "t"))
    on_disk = sum(p.stat().st_size for p in (tmp_path / "t").glob("*.parquet"))
    tracker = spark.sparkContext.statusTracker()

    def without_a_job(frame: DataFrame) -> PlanSize:
        spark.sparkContext.setJobGroup("plan-size", "no job may run")
        try:
            return plan_size(frame)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    file_size = without_a_job(files.where("x > 0"))
    # A cache serves every later plan over the same files, so the files are measured first.
    cached = files.cache()
    try:
        assert cached.count() == 300
        cache_size = without_a_job(cached)
        # A projection keeps an estimate of the bytes, not the row count (no CBO here).
        projected = without_a_job(cached.select("x"))
    finally:
        cached.unpersist()
    assert tracker.getJobIdsForGroup("plan-size") == []
    assert file_size == PlanSize(bytes=float(on_disk), rows=None)
    assert cache_size.rows == 300 and cache_size.bytes > 0
    assert projected.rows is None and 0 < projected.bytes < cache_size.bytes


def test_the_cost_explain_of_a_connect_session_is_parsed() -> None:
    text = (
        "== Parsed Logical Plan ==\nRelation [a#1L] parquet\n\n"
        "== Optimized Logical Plan ==\n"
        "Filter (x#2 > 0.0), Statistics(sizeInBytes=235.9 KiB, rowCount=2.00E+4)\n"
        "+- Relation [x#2] parquet, Statistics(sizeInBytes=1.5 MiB)\n"
    )
    assert parse_cost_statistics(text) == PlanSize(bytes=235.9 * 1024, rows=20_000)
    assert parse_cost_statistics(
        "== Optimized Logical Plan ==\nRelation [x#2] parquet, Statistics(sizeInBytes=12.0 B)"
    ) == PlanSize(bytes=12.0, rows=None)
    with pytest.raises(SparkServerError, match=r"expected 'Statistics\(sizeInBytes=\.\.\.\)'"):
        parse_cost_statistics("== Optimized Logical Plan ==\nRelation [x#2] parquet")
