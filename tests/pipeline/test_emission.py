"""Which input tuples must emit rows: each join kind's rule, and pending tuples accounted.

Each rule is checked on Spark frames and, over the same rows, on Arrow tables (the audit of
a batch validated in the driver's memory): both must give the same flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.rows import Rows
from pipeline.emission import equi_input_accounting, master_keys, theta_input_accounting
from pipeline.stage_config import ThetaStage
from tests.pipeline.ssbj_harness import config_for
from tests.rows_check import rows_both_ways
from warehouse.delta.embedded import EmbeddedDeltaEngine

STREAM = T.StructType([T.StructField("id", T.LongType()), T.StructField("k", T.LongType())])
MASTER = T.StructType([T.StructField("mk", T.LongType())])


def flags(rows: Rows, spark: SparkSession) -> dict[int, bool]:
    """The flags of ``rows``, the same read both ways; one row per tuple."""
    collected = rows_both_ways(rows, spark)
    assert len(collected) == len({r["tuple_id"] for r in collected}), "one row per tuple"
    return {r["tuple_id"]: r["must_emit"] for r in collected}


def test_inner_equi_requires_exactly_the_tuples_whose_key_is_in_the_master(
    spark: SparkSession, tmp_path: Path
) -> None:
    stage = config_for(tmp_path, "ssbj", 2, 1, "inner").stage("enrich")
    tuples = spark.createDataFrame([(1, 10), (2, 20), (3, 10), (4, None)], STREAM)
    master = spark.createDataFrame([(10,), (10,), (30,)], MASTER)  # duplicate keys too
    waiting = spark.createDataFrame([(5, 10), (6, 99)], STREAM)
    got = flags(
        equi_input_accounting(
            stage,  # type: ignore[arg-type]
            Rows.of(master),
            Rows.of(tuples),
            Rows.of(waiting),
            "id",
        ),
        spark,
    )
    # A waiting tuple's master version may differ from the latest: accounted, not required.
    assert got == {1: True, 2: False, 3: True, 4: False, 5: False, 6: False}


def test_inner_equi_compares_keys_of_other_integer_widths(
    spark: SparkSession, tmp_path: Path
) -> None:
    stage = config_for(tmp_path, "ssbj", 2, 1, "inner").stage("enrich")
    tuples = pa.table(
        {"id": pa.array([1, 2, 1], pa.int64()), "k": pa.array([10, 20, 10], pa.int32())}
    )
    master = pa.table({"mk": pa.array([10, 30], pa.int64())})
    got = equi_input_accounting(stage, Rows.of(master), Rows.of(tuples), None, "id")  # type: ignore[arg-type]
    assert flags(got, spark) == {1: True, 2: False}  # tuple 1 twice (two files): one row


def test_left_joins_require_every_tuple_including_the_waiting_ones(
    spark: SparkSession, tmp_path: Path
) -> None:
    stage = config_for(tmp_path, "ssbj", 2, 1, "left").stage("enrich")
    tuples = Rows.of(spark.createDataFrame([(1, 10), (2, 20)], STREAM))
    waiting = Rows.of(spark.createDataFrame([(3, 10)], STREAM))
    got = flags(equi_input_accounting(stage, None, tuples, waiting, "id"), spark)  # type: ignore[arg-type]
    assert got == {1: True, 2: True, 3: True}
    theta = ThetaStage.model_validate(
        {
            "name": "t",
            "kind": "theta",
            "input": "s",
            "master": "m",
            "predicate": {"type": "band", "stream_column": "k", "master_column": "mk", "eps": 1},
            "join": "left",
            "output": "o",
        }
    )
    assert flags(theta_input_accounting(theta, tuples, waiting, "id"), spark) == got
    inner = theta.model_copy(update={"join": "inner"})
    assert flags(theta_input_accounting(inner, tuples, None, "id"), spark) == {1: False, 2: False}


@pytest.mark.parametrize(
    ("stream_key", "master_key", "master_rows"),
    [
        (T.IntegerType(), T.LongType(), [(10,), (10,), (30,), (None,)]),  # filtered as read
        (T.LongType(), T.StringType(), [("10",), ("030",), (None,)]),  # compared as SQL does
    ],
    ids=["integer-widths", "integer-against-string"],
)
def test_master_keys_read_into_the_driver_flag_what_spark_flags(
    spark: SparkSession,
    tmp_path: Path,
    stream_key: T.DataType,
    master_key: T.DataType,
    master_rows: list[tuple[Any, ...]],
) -> None:
    """The audit of a small batch reads the master's keys with pyarrow (only the asked
    ones where both sides are integers): the same flags as Spark reading every key of the
    same Delta table, key types of two kinds included (a string key compared as the
    number it spells)."""
    stage = config_for(tmp_path, "ssbj", 2, 1, "inner").stage("enrich")
    engine = EmbeddedDeltaEngine(spark)
    path = str(tmp_path / "master")
    schema = T.StructType([T.StructField("mk", master_key)])
    engine.create_table(path, schema)
    for rows in (master_rows[:1], master_rows[1:]):  # two files
        engine.append(path, spark.createDataFrame(rows, schema))
    stream = T.StructType([T.StructField("id", T.LongType()), T.StructField("k", stream_key)])
    tuples = Rows.of(spark.createDataFrame([(1, 10), (2, 20), (3, 10), (4, None), (5, 30)], stream))
    keys = master_keys(stage, engine, path, tuples)  # type: ignore[arg-type]
    assert keys is not None
    got = flags(equi_input_accounting(stage, keys, tuples, None, "id"), spark)  # type: ignore[arg-type]
    assert got == {1: True, 2: False, 3: True, 4: False, 5: True}
