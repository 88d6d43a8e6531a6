"""The audit views: pending ages, the already-published ids of waiting tuples, and the
interval a tuple falls in; each read both ways (``tests.rows_check``)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.rows import Rows
from joins.columns import INTERVAL_START, with_interval_start
from quality.audit_views import (
    input_accounting,
    no_pending,
    no_published,
    pending_ages,
    published_tuples,
)
from tests.rows_check import rows_both_ways

HOUR = dt.datetime(2026, 1, 1, 10)
WITH_INTERVAL = T.StructType(
    [T.StructField("id", T.LongType()), T.StructField(INTERVAL_START, T.TimestampType())]
)


def test_pending_age_is_steps_since_entry(spark: SparkSession) -> None:
    schema = T.StructType([T.StructField("id", T.StringType()), T.StructField("e", T.LongType())])
    pending = Rows.of(spark.createDataFrame([("a", 3), ("b", 7)], schema))
    ages = rows_both_ways(pending_ages(pending, "id", "e", next_step=8, max_age_steps=4), spark)
    assert [tuple(r.values()) for r in ages] == [("a", 5, 4), ("b", 1, 4)]
    assert pending_ages(pending, "id", "e", 8, 4).to_arrow().schema.types[1:] == [pa.int64()] * 2


def test_published_ids_of_waiting_tuples_only_once_each(spark: SparkSession) -> None:
    earlier = HOUR - dt.timedelta(hours=1)
    published = spark.createDataFrame(
        # id 1 published twice (two matches); id 3 before the oldest waiting interval
        [(1, HOUR), (1, HOUR), (2, HOUR), (3, earlier), (4, HOUR), (None, HOUR)],
        WITH_INTERVAL,
    )
    waiting = Rows.of(
        spark.createDataFrame([(1, HOUR), (3, HOUR), (5, HOUR), (None, HOUR)], WITH_INTERVAL)
    )
    ids = rows_both_ways(published_tuples(Rows.of(published), waiting, "id"), spark)
    # 3's row lies in an interval older than every waiting tuple's: not scanned, by design.
    assert ids == [{"tuple_id": 1}]
    bare = Rows.of(published.drop(INTERVAL_START))
    # without interval columns every published row is a candidate
    assert rows_both_ways(published_tuples(bare, waiting, "id"), spark) == [
        {"tuple_id": 1},
        {"tuple_id": 3},
    ]


def test_empty_views_carry_the_id_type(spark: SparkSession) -> None:
    ids = Rows.of(spark.createDataFrame([("a",)], "id string"))
    assert rows_both_ways(no_pending(ids, "id"), spark) == []
    assert no_pending(ids, "id").to_spark().schema["tuple_id"].dataType == T.StringType()
    assert (
        no_pending(ids, "id").to_arrow().schema
        == pending_ages(
            Rows.of(spark.createDataFrame([("a", 1)], "id string, e long")), "id", "e", 2, 1
        )
        .to_arrow()
        .schema
    )
    assert rows_both_ways(no_published(ids, "id"), spark) == []


def test_accounting_flags_each_tuple_once_by_its_master_key(spark: SparkSession) -> None:
    tuples = Rows.of(
        spark.createDataFrame([(1, 10), (2, 20), (1, 10), (3, None)], "id long, k int")
    )
    keys = Rows.of(spark.createDataFrame([(10,), (10,), (30,)], "mk long"))
    flags = rows_both_ways(input_accounting(tuples, "id", False, keys, {"k": "mk"}), spark)
    assert flags == [
        {"tuple_id": 1, "must_emit": True},
        {"tuple_id": 2, "must_emit": False},
        {"tuple_id": 3, "must_emit": False},
    ]
    every = rows_both_ways(input_accounting(tuples, "id", True), spark)
    assert [r["must_emit"] for r in every] == [True, True, True]


def test_interval_start_floors_the_event_time(spark: SparkSession) -> None:
    schema = T.StructType([T.StructField("t", T.TimestampType())])
    times = [
        (dt.datetime(2026, 1, 1, 10, 59, 59, 999999),),
        (dt.datetime(2026, 1, 1, 11, 0, 0),),
        (dt.datetime(1969, 12, 31, 23, 30, 0, 1),),  # before the epoch: floors down
        (None,),
    ]
    frame = spark.createDataFrame(times, schema)
    rows = with_interval_start(Rows.of(frame), "t", 3600)
    starts = {
        (r["t"].replace(tzinfo=None) if r["t"] else None): r[INTERVAL_START]
        for r in rows_both_ways(rows, spark)
    }
    naive = {t: None if s is None else s.replace(tzinfo=None) for t, s in starts.items()}
    assert naive == {
        dt.datetime(2026, 1, 1, 10, 59, 59, 999999): dt.datetime(2026, 1, 1, 10),
        dt.datetime(2026, 1, 1, 11): dt.datetime(2026, 1, 1, 11),
        dt.datetime(1969, 12, 31, 23, 30, 0, 1): dt.datetime(1969, 12, 31, 23),
        None: None,
    }
    assert with_interval_start(rows, "t", 60).to_arrow() == rows.to_arrow()  # kept
