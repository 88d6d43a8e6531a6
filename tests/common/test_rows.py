"""Rows as Arrow or Spark: each source converts to the other form, a transform runs on
either, and the two primitives narwhals lacks on Spark agree with Arrow's."""

from __future__ import annotations

import datetime as dt

import narwhals.stable.v2 as nw
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.rows import Frame, Rows, with_epoch_micros, with_timestamp_of_micros
from tests.rows_check import rows_both_ways

UTC = dt.UTC


def _doubled_evens(frame: Frame, column: str) -> Frame:
    return frame.filter(nw.col(column) % 2 == 0).select((nw.col(column) * 2).alias("twice"))


def test_a_source_in_one_form_converts_to_the_other(spark: SparkSession) -> None:
    table = pa.table({"id": pa.array([1, 2, 2, None], pa.int64())})
    from_arrow = rows_both_ways(Rows.of(table), spark)
    frame = spark.createDataFrame([(1,), (2,), (2,), (None,)], "id long")
    assert rows_both_ways(Rows.of(frame), spark) == from_arrow
    assert [r["id"] for r in from_arrow] == [1, 2, 2, None]  # duplicates kept


def test_a_transform_runs_on_the_form_asked_for(spark: SparkSession) -> None:
    reads: list[str] = []

    def arrow() -> pa.Table:
        reads.append("arrow")
        return pa.table({"n": pa.array([1, 2, 3, 4, 4], pa.int64())})

    def on_spark():  # type: ignore[no-untyped-def]
        reads.append("spark")
        return spark.createDataFrame([(1,), (2,), (3,), (4,), (4,)], "n long")

    source = Rows.read(arrow=arrow, spark=on_spark)
    doubled = Rows.apply(_doubled_evens, source, column="n")
    assert doubled.to_arrow().column("twice").to_pylist() == [4, 8, 8]
    assert reads == ["arrow"]  # no Spark frame was planned for the driver's read
    assert sorted(r["twice"] for r in doubled.to_spark().collect()) == [4, 8, 8]
    assert reads == ["arrow", "spark"]
    doubled.to_arrow()
    assert reads == ["arrow", "spark"]  # each form is read once


def test_rows_read_into_the_driver_need_a_session_for_spark() -> None:
    rows = Rows.of(pa.table({"a": [1]}))
    with pytest.raises(ValueError, match="SparkSession is needed"):
        rows.to_spark()
    with pytest.raises(ValueError, match="a way to read them"):
        Rows()


def test_epoch_micros_round_trip_on_both_engines(spark: SparkSession) -> None:
    times = [
        dt.datetime(2026, 1, 1, 10, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1969, 12, 31, 23, 30, 0, 1, tzinfo=UTC),  # before the epoch
        None,
    ]
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("t", T.TimestampType())]
    )
    frame = spark.createDataFrame(list(enumerate(times)), schema)

    def micros(rows: Frame) -> Frame:
        stamped = with_epoch_micros(rows, "t", "us")
        return with_timestamp_of_micros(stamped, "us", "back")

    got = rows_both_ways(Rows.apply(micros, Rows.of(frame)), spark)
    expected = [None if t is None else int(t.timestamp() * 1_000_000) for t in times]
    assert (
        [r["us"] for r in sorted(got, key=lambda r: r["id"])]
        == [
            1767265199999999,
            -1799999999,
            None,
        ]
        == expected
    )
    assert all(r["back"] == r["t"] for r in got)
