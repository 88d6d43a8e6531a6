"""Spark's xxhash64 in the driver (joins/ssbj/spark_hash.py) against Spark's own, row by row."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from joins.ssbj.spark_hash import supports, xxhash64

UTC = dt.UTC

# Each supported Arrow type with a strategy of its values (None: null) and Spark's type.
TYPES = {
    "tinyint": (pa.int8(), st.integers(-(2**7), 2**7 - 1)),
    "smallint": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "int": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "bigint": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "boolean": (pa.bool_(), st.booleans()),
    "float": (pa.float32(), st.floats(width=32, allow_nan=True, allow_infinity=True)),
    "double": (pa.float64(), st.floats(allow_nan=True, allow_infinity=True)),
    "date": (pa.date32(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)).map(
            lambda t: t.replace(tzinfo=UTC)
        ),
    ),
}


def spark_hashes(spark: SparkSession, table: pa.Table) -> list[int]:
    frame = spark.createDataFrame(table)
    return [row[0] for row in frame.select(F.xxhash64(*table.column_names)).collect()]


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3))
    rows = draw(st.integers(1, 12))
    columns = {}
    for i, name in enumerate(names):
        arrow_type, values = TYPES[name]
        column = draw(st.lists(st.none() | values, min_size=rows, max_size=rows))
        columns[f"c{i}_{name}"] = pa.array(column, arrow_type)
    return pa.table(columns)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(table=tables())
def test_hashes_equal_sparks_for_every_supported_type_and_null(
    spark: SparkSession, table: pa.Table
) -> None:
    assert xxhash64(table.columns).to_pylist() == spark_hashes(spark, table)


def test_zero_and_nan_hash_as_spark_normalises_them(spark: SparkSession) -> None:
    """-0.0 hashes as 0.0, and every NaN bit pattern as the canonical NaN."""
    other_nan = np.array([0x7FF0000000000001], dtype=np.uint64).view(np.float64)[0]
    assert math.isnan(other_nan)
    table = pa.table({"d": pa.array([0.0, -0.0, math.nan, other_nan], pa.float64())})
    hashes = xxhash64(table.columns).to_pylist()
    assert hashes[0] == hashes[1] and hashes[2] == hashes[3]
    assert hashes == spark_hashes(spark, table)


def test_chunked_columns_hash_as_one_array(spark: SparkSession) -> None:
    chunked = pa.chunked_array([pa.array([1, None], pa.int64()), pa.array([3], pa.int64())])
    table = pa.table({"k": chunked})
    assert xxhash64(table.columns).to_pylist() == spark_hashes(spark, table)


def test_types_the_driver_does_not_hash_are_refused_by_name() -> None:
    assert not supports(pa.string())
    assert not supports(pa.decimal128(10, 2))
    assert supports(pa.int64()) and supports(pa.date32())
    with pytest.raises(TypeError, match="string"):
        xxhash64([pa.array(["a"])])
    with pytest.raises(ValueError, match="at least one column"):
        xxhash64([])
