"""The audit views: pending ages and the already-published ids of waiting tuples."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from joins.columns import INTERVAL_START, with_interval_start, with_interval_start_arrow
from quality.audit_views import (
    no_pending,
    no_pending_arrow,
    no_published,
    no_published_arrow,
    oldest_interval_arrow,
    pending_ages,
    pending_ages_arrow,
    published_tuples,
    published_tuples_arrow,
)

HOUR = dt.datetime(2026, 1, 1, 10)


def test_pending_age_is_steps_since_entry(spark: SparkSession) -> None:
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("entry", T.LongType())])
    pending = spark.createDataFrame([(1, 3), (2, 7)], schema)
    rows = pending_ages(pending, "id", "entry", next_step=8, max_age_steps=4).collect()
    assert sorted(tuple(r) for r in rows) == [(1, 5, 4), (2, 1, 4)]


def test_published_ids_of_waiting_tuples_only_once_each(spark: SparkSession) -> None:
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField(INTERVAL_START, T.TimestampType())]
    )
    earlier = HOUR - dt.timedelta(hours=1)
    published = spark.createDataFrame(
        # id 1 published twice (two matches); id 3 before the oldest waiting interval
        [(1, HOUR), (1, HOUR), (2, HOUR), (3, earlier), (4, HOUR)],
        schema,
    )
    waiting = spark.createDataFrame([(1, HOUR), (3, HOUR), (5, HOUR)], schema)
    ids = sorted(r["tuple_id"] for r in published_tuples(published, waiting, "id").collect())
    # 3's row lies in an interval older than every waiting tuple's: not scanned, by design.
    assert ids == [1]
    without_intervals = published_tuples(published.drop(INTERVAL_START), waiting, "id")
    assert sorted(r["tuple_id"] for r in without_intervals.collect()) == [1, 3]


def test_empty_views_carry_the_id_type(spark: SparkSession) -> None:
    assert no_pending(spark, T.StringType()).schema["tuple_id"].dataType == T.StringType()
    assert no_published(spark, T.LongType()).count() == 0


def test_in_memory_views_equal_the_spark_views(spark: SparkSession) -> None:
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField(INTERVAL_START, T.TimestampType())]
    )
    earlier = HOUR - dt.timedelta(hours=1)
    published = spark.createDataFrame(
        [(1, HOUR), (1, HOUR), (2, HOUR), (3, earlier), (4, HOUR), (None, HOUR)], schema
    )
    waiting = spark.createDataFrame([(1, HOUR), (3, HOUR), (5, HOUR), (None, HOUR)], schema)
    spark_ids = sorted(r["tuple_id"] for r in published_tuples(published, waiting, "id").collect())
    rows, asked = published.toArrow(), waiting.toArrow()
    oldest = oldest_interval_arrow([asked])
    assert oldest is not None and oldest.replace(tzinfo=None) == HOUR
    in_memory = published_tuples_arrow(rows, asked, "id", oldest)
    assert sorted(in_memory.column("tuple_id").to_pylist()) == spark_ids == [1]
    assert in_memory.schema.field("tuple_id").type == pa.int64()
    # without interval columns every published row is a candidate, as on Spark
    bare = published_tuples_arrow(rows.drop_columns([INTERVAL_START]), asked, "id", oldest)
    assert sorted(bare.column("tuple_id").to_pylist()) == [1, 3]

    entries = T.StructType([T.StructField("id", T.StringType()), T.StructField("e", T.LongType())])
    pending = spark.createDataFrame([("a", 3), ("b", 7)], entries)
    on_spark = sorted(tuple(r) for r in pending_ages(pending, "id", "e", 8, 4).collect())
    ages = pending_ages_arrow(pending.toArrow(), "id", "e", next_step=8, max_age_steps=4)
    assert (
        sorted(tuple(r.values()) for r in ages.to_pylist())
        == on_spark
        == [("a", 5, 4), ("b", 1, 4)]
    )
    assert no_pending_arrow(pa.string()).schema == ages.schema
    assert no_published_arrow(pa.int64()).num_rows == 0
    assert oldest_interval_arrow([rows.slice(0, 0)]) is None


def test_in_memory_interval_start_floors_like_spark(spark: SparkSession) -> None:
    schema = T.StructType([T.StructField("t", T.TimestampType())])
    times = [
        (dt.datetime(2026, 1, 1, 10, 59, 59, 999999),),
        (dt.datetime(2026, 1, 1, 11, 0, 0),),
        (dt.datetime(1969, 12, 31, 23, 30, 0, 1),),  # before the epoch: floors down
        (None,),
    ]
    frame = spark.createDataFrame(times, schema)
    on_spark = [r[INTERVAL_START] for r in with_interval_start(frame, "t", 3600).collect()]
    in_memory = with_interval_start_arrow(frame.toArrow(), "t", 3600).column(INTERVAL_START)
    naive = [None if v is None else v.replace(tzinfo=None) for v in in_memory.to_pylist()]
    assert naive == on_spark
    assert on_spark[2] == dt.datetime(1969, 12, 31, 23, 0)
