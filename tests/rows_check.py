"""Reading a :class:`common.rows.Rows` both ways in a test: the same rows, the same columns."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from common.rows import Rows


def _key(value: Any) -> tuple[int, str]:
    return (value is None, repr(value))


def rows_both_ways(rows: Rows, spark: SparkSession) -> list[dict[str, Any]]:
    """``rows`` read into the driver and as a Spark frame: asserts both hold the same
    multiset of rows under the same column names and types, and returns them sorted."""
    in_driver = rows.to_arrow()
    on_spark = rows.to_spark(spark).toArrow()
    assert in_driver.column_names == on_spark.column_names
    assert [_normal(t) for t in in_driver.schema.types] == [
        _normal(t) for t in on_spark.schema.types
    ], (in_driver.schema, on_spark.schema)
    first = sorted(in_driver.to_pylist(), key=lambda r: [_key(v) for v in r.values()])
    second = sorted(on_spark.to_pylist(), key=lambda r: [_key(v) for v in r.values()])
    assert first == second
    return first


def _normal(data_type: pa.DataType) -> pa.DataType:
    """A type as Spark hands it back: strings are strings whatever their offsets' width,
    timestamps are microseconds in UTC."""
    if pa.types.is_large_string(data_type):
        return pa.string()
    if pa.types.is_timestamp(data_type):
        return pa.timestamp("us", "UTC")
    return data_type
