"""The audit views: pending ages and the already-published ids of waiting tuples."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from joins.columns import INTERVAL_START
from quality.audit_views import no_pending, no_published, pending_ages, published_tuples

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
