"""Measured bytes per row (pipeline/row_bytes.py): Arrow bytes of a sample, measured once and
only when asked for."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import SparkSession
from pyspark.sql import types as T

from pipeline.row_bytes import MeasuredRowBytes, measured_row_bytes

SCHEMA = T.StructType([T.StructField("k", T.LongType()), T.StructField("v", T.DoubleType())])


def test_row_bytes_are_measured_on_first_use_and_once(spark: SparkSession) -> None:
    stream = spark.createDataFrame([(i, i / 3) for i in range(50)], SCHEMA)
    master = spark.createDataFrame([(i, None) for i in range(20)], SCHEMA)
    tracker = spark.sparkContext.statusTracker()

    def jobs_for(group: str, action: Callable[[], object]) -> int:
        spark.sparkContext.setJobGroup(group, "count the jobs")
        try:
            action()
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return len(tracker.getJobIdsForGroup(group))

    sizes = MeasuredRowBytes(stream, master)
    assert jobs_for("row-bytes-none", lambda: None) == 0  # building it measures nothing
    assert jobs_for("row-bytes-master", sizes.master) >= 1
    assert jobs_for("row-bytes-master-again", sizes.master) == 0
    assert jobs_for("row-bytes-stream", sizes.stream) >= 1
    # Two 8-byte columns: 16 bytes of values per row, plus validity bitmaps.
    assert 16.0 <= sizes.stream() == measured_row_bytes(stream) < 17.0
    assert sizes.master() == measured_row_bytes(master)


def test_an_empty_side_counts_one_byte_per_row(spark: SparkSession) -> None:
    empty = spark.createDataFrame([], SCHEMA)
    assert measured_row_bytes(empty) is None
    assert MeasuredRowBytes(empty, empty).master() == 1.0
