"""The shipped suites' SQL expectations give the same rows in memory (DuckDB) as on Spark.

Each ``unexpected_rows_query`` of ``expectations/*.json`` runs over the same generated
batch and audit views on both engines; the rows must be equal as multisets. The seeded data
gives every query rows (duplicated ids, unmatched tuples, null versions, tuples past their
age), so an engine that returned nothing would fail.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.errors import ConfigError
from quality.audit_views import (
    AGE_STEPS,
    INPUT_VIEW,
    MAX_AGE_STEPS,
    MUST_EMIT,
    PENDING_VIEW,
    PUBLISHED_VIEW,
    TUPLE_ID,
)
from quality.in_memory_sql import BATCH_RELATION, run_query, to_duckdb

SUITES = Path(__file__).resolve().parents[2] / "expectations"
SEED = 1
SPARK_TYPES = {
    "LongType": T.LongType(),
    "DoubleType": T.DoubleType(),
    "StringType": T.StringType(),
    "DateType": T.DateType(),
    "TimestampType": T.TimestampType(),
}
VIEW_SCHEMAS = {
    INPUT_VIEW: T.StructType(
        [T.StructField(TUPLE_ID, T.LongType()), T.StructField(MUST_EMIT, T.BooleanType())]
    ),
    PENDING_VIEW: T.StructType(
        [
            T.StructField(TUPLE_ID, T.LongType()),
            T.StructField(AGE_STEPS, T.LongType()),
            T.StructField(MAX_AGE_STEPS, T.LongType()),
        ]
    ),
    PUBLISHED_VIEW: T.StructType([T.StructField(TUPLE_ID, T.LongType())]),
}


def shipped_queries() -> list[tuple[str, T.StructType, str]]:
    """(suite, the batch schema its type checks declare, query) for every SQL expectation."""
    found = []
    for path in sorted(SUITES.glob("*.json")):
        suite = json.loads(path.read_text())
        fields = [
            T.StructField(e["kwargs"]["column"], SPARK_TYPES[e["kwargs"]["type_"]])
            for e in suite["expectations"]
            if e["type"] == "expect_column_values_to_be_of_type"
        ]
        for e in suite["expectations"]:
            if e["type"] == "unexpected_rows_expectation":
                query = e["kwargs"]["unexpected_rows_query"]
                found.append((path.stem, T.StructType(fields), query))
    return found


def value(data_type: T.DataType, rng: random.Random) -> Any:
    """A value with collisions: ids from a small range, a null one time in five."""
    if rng.random() < 0.2:
        return None
    if isinstance(data_type, T.LongType):
        return rng.randrange(8)
    if isinstance(data_type, T.DoubleType):
        return rng.choice([0.5, 1.0, 2.5])
    if isinstance(data_type, T.StringType):
        return rng.choice(["a", "b"])
    if isinstance(data_type, T.DateType):
        return dt.date(2024, 1, rng.randrange(1, 4))
    return dt.datetime(2024, 1, 1, rng.randrange(3))


def rows_of(schema: T.StructType, count: int, rng: random.Random) -> list[tuple[Any, ...]]:
    return [tuple(value(f.dataType, rng) for f in schema.fields) for _ in range(count)]


def view_rows(rng: random.Random) -> dict[str, list[tuple[Any, ...]]]:
    ids = range(12)
    return {
        INPUT_VIEW: [(i, rng.random() < 0.7) for i in ids if rng.random() < 0.8],
        PENDING_VIEW: [(i, rng.randrange(4), 2) for i in ids if rng.random() < 0.3],
        PUBLISHED_VIEW: [(i,) for i in ids if rng.random() < 0.2],
    }


def canonical(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(sorted(r.items())) for r in rows)


def test_shipped_queries_give_the_same_rows_on_both_engines(spark: SparkSession) -> None:
    queries = shipped_queries()
    assert queries, "the shipped suites hold SQL expectations"
    rng = random.Random(SEED)
    arrow_views = {}
    for name, rows in view_rows(rng).items():
        frame = spark.createDataFrame(rows, VIEW_SCHEMAS[name])
        frame.createOrReplaceTempView(name)
        arrow_views[name] = frame.toArrow()
    batches: dict[str, Any] = {}
    for suite, schema, query in queries:
        if suite not in batches:  # one batch per suite, shared by its queries
            batch = spark.createDataFrame(rows_of(schema, 40, rng), schema)
            batch.createOrReplaceTempView(f"batch_{suite}")
            batches[suite] = batch.toPandas()
        on_spark = [r.asDict() for r in spark.sql(query.format(batch=f"batch_{suite}")).collect()]
        in_memory = run_query(
            query.format(batch=BATCH_RELATION), batches[suite], arrow_views
        ).to_pylist()
        assert on_spark, f"the data gives {suite}'s query rows to compare: {query}"
        assert canonical(in_memory) == canonical(on_spark), (suite, query)


def test_a_query_that_cannot_be_translated_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unexpected_rows_query"):
        to_duckdb("SELECT (1 FROM")


def test_a_query_runs_over_the_named_views_only() -> None:
    views = {INPUT_VIEW: pa.table({TUPLE_ID: [1, 2], MUST_EMIT: [True, False]})}
    rows = run_query(
        f"SELECT i.tuple_id FROM {INPUT_VIEW} i LEFT ANTI JOIN {BATCH_RELATION} b "
        "ON b.id = i.tuple_id WHERE i.must_emit",
        pa.table({"id": [2]}).to_pandas(),
        views,
    )
    assert rows.to_pylist() == [{TUPLE_ID: 1}]
