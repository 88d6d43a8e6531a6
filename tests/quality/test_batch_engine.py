"""GX's pandas engine gives the verdicts its Spark engine gives, for every expectation the
audit lets it check (SQL expectations through DuckDB, Spark types against the schema);
and the choice keeps everything else on Spark."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from quality.audit_views import INPUT_VIEW
from quality.batch_engine import (
    IN_MEMORY_EXPECTATIONS,
    InMemoryBatch,
    choose_batch_engine,
    queries_views,
)
from quality.gate import QualityGate
from quality.results import ExpectationOutcome

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), True),
        T.StructField("k", T.LongType(), True),
        T.StructField("price", T.DoubleType(), True),
        T.StructField("flag", T.StringType(), True),
        T.StructField("day", T.DateType(), True),
        T.StructField("at", T.TimestampType(), True),
    ]
)
ROWS = [
    (1, 10, 5.0, "a", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 1)),
    (2, 10, 999.5, "b", dt.date(2024, 1, 2), dt.datetime(2024, 1, 1, 2)),
    (3, None, None, None, None, None),
    (3, 11, -1.0, "z", dt.date(2024, 1, 3), dt.datetime(2024, 1, 1, 3)),
    (4, 12, 1e6, "a", dt.date(2024, 1, 4), dt.datetime(2024, 1, 1, 4)),
]


def expectation(kind: str, **kwargs: Any) -> dict[str, Any]:
    return {"type": kind, "kwargs": kwargs}


# Each checked with passing and failing arguments, nulls and duplicates in the data.
EXPECTATIONS = [
    expectation("expect_column_to_exist", column="price"),
    expectation("expect_column_to_exist", column="missing"),
    expectation("expect_column_values_to_be_between", column="price", min_value=0, max_value=1000),
    expectation("expect_column_values_to_be_between", column="k", min_value=10, max_value=None),
    expectation("expect_column_values_to_be_between", column="price", min_value=-5, max_value=2e6),
    expectation("expect_column_values_to_be_in_set", column="flag", value_set=["a", "b"]),
    expectation("expect_column_values_to_be_in_set", column="k", value_set=[10, 11, 12]),
    expectation("expect_column_values_to_not_be_in_set", column="flag", value_set=["z"]),
    expectation("expect_column_values_to_be_null", column="k"),
    expectation("expect_column_values_to_not_be_null", column="k"),
    expectation("expect_column_values_to_not_be_null", column="id"),
    expectation("expect_column_values_to_be_unique", column="id"),
    expectation("expect_column_values_to_be_unique", column="at"),
    expectation("expect_compound_columns_to_be_unique", column_list=["id", "k"]),
    expectation("expect_compound_columns_to_be_unique", column_list=["k", "flag"]),
    expectation("expect_table_columns_to_match_ordered_list", column_list=SCHEMA.fieldNames()),
    expectation("expect_table_columns_to_match_set", column_set=["id", "k"], exact_match=True),
    expectation("expect_table_row_count_to_be_between", min_value=1, max_value=5),
    expectation("expect_table_row_count_to_be_between", min_value=6, max_value=None),
]


def test_every_in_memory_expectation_is_covered() -> None:
    assert {e["type"] for e in EXPECTATIONS} == IN_MEMORY_EXPECTATIONS


def test_pandas_and_spark_give_the_same_verdicts(spark: SparkSession, tmp_path: Path) -> None:
    from great_expectations.core.expectation_suite import ExpectationSuite

    batch = spark.createDataFrame(ROWS, SCHEMA)
    gate = QualityGate(tmp_path / "gx")
    verdicts = {}
    for name, data in (("spark", batch), ("pandas", batch.toPandas())):
        suite = ExpectationSuite(name=f"all_{name}", expectations=EXPECTATIONS)
        outcome = gate.validate("t", suite, data, f"run-{name}")
        verdicts[name] = [
            (e.expectation, e.column, e.success, e.unexpected_count, e.error is None)
            for e in outcome.expectations
        ]
    assert len(verdicts["spark"]) == len(EXPECTATIONS)
    assert {v[2] for v in verdicts["spark"]} == {True, False}  # both verdicts are exercised
    assert all(v[4] for v in verdicts["spark"]), verdicts["spark"]  # no expectation errored
    assert verdicts["pandas"] == verdicts["spark"]


def test_only_small_batches_of_checks_computable_in_memory_go_in_memory() -> None:
    between = ("expect_column_values_to_be_between", {"column": "p", "min_value": 0})
    typed = ("expect_column_values_to_be_of_type", {"column": "p", "type_": "LongType"})
    sql = ("unexpected_rows_expectation", {"unexpected_rows_query": "SELECT 1"})
    dated = ("expect_column_values_to_be_between", {"column": "d", "min_value": "2024-01-01"})
    mean = ("expect_column_mean_to_be_between", {"column": "p", "min_value": 0})
    assert choose_batch_engine([between], 100, 1000).name == "pandas"
    assert choose_batch_engine([], 100, 1000).name == "pandas"
    assert choose_batch_engine([between, typed, sql], 100, 1000).name == "pandas"
    assert choose_batch_engine([between], None, 1000).name == "spark"
    assert choose_batch_engine([between], 1001, 1000).name == "spark"
    assert choose_batch_engine([between], 1, 0).name == "spark"
    for other in (dated, mean):
        assert choose_batch_engine([between, other], 100, 1000).name == "spark", other


def verdict(outcome: ExpectationOutcome) -> tuple[str, bool, int | None]:
    return (outcome.expectation, outcome.success, outcome.unexpected_count)


def test_types_and_sql_give_the_same_verdicts_in_memory_without_a_spark_job(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark types are checked against the frame's schema (no job), SQL by DuckDB; each
    passes and fails where it does on Spark, and the outcomes keep the suite's order."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    typed = [
        expectation("expect_column_values_to_be_of_type", column="id", type_="LongType"),
        expectation("expect_column_values_to_be_of_type", column="price", type_="StringType"),
        expectation(
            "expect_column_values_to_be_in_type_list", column="day", type_list=["DateType"]
        ),
    ]
    sql = [
        expectation(
            "unexpected_rows_expectation",
            unexpected_rows_query=f"SELECT i.tuple_id FROM {INPUT_VIEW} i LEFT ANTI JOIN "
            "{batch} b ON b.id = i.tuple_id WHERE i.must_emit",
            description="conservation",
        ),
        expectation(
            "unexpected_rows_expectation",
            unexpected_rows_query="SELECT id FROM {batch} GROUP BY id HAVING count(*) > 1",
            description="unique ids",
        ),
        expectation(
            "unexpected_rows_expectation",
            unexpected_rows_query="SELECT id FROM {batch} WHERE count_if(k IS NULL) > 5",
            description="DuckDB cannot run an aggregate in WHERE: an error, not a pass",
        ),
    ]
    mixed = [sql[0], typed[0], EXPECTATIONS[2], typed[1], sql[1], typed[2], sql[2]]
    batch = spark.createDataFrame(ROWS, SCHEMA)
    input_schema = T.StructType(
        [T.StructField("tuple_id", T.LongType()), T.StructField("must_emit", T.BooleanType())]
    )
    views = {INPUT_VIEW: spark.createDataFrame([(1, True), (7, True), (8, False)], input_schema)}
    memory = InMemoryBatch(
        batch.toPandas(), batch, {name: view.toArrow() for name, view in views.items()}
    )
    gate = QualityGate(tmp_path / "gx")
    verdicts = {}
    spark.sparkContext.setJobGroup("in-memory-validation", "no job expected")
    try:
        outcome = gate.validate("t", ExpectationSuite(name="mixed", expectations=mixed), memory, "")
        jobs = spark.sparkContext.statusTracker().getJobIdsForGroup("in-memory-validation")
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    assert jobs == []
    verdicts["pandas"] = [verdict(e) for e in outcome.expectations]
    errors = [e.error for e in outcome.expectations]
    on_spark = gate.validate(
        "t", ExpectationSuite(name="mixed", expectations=mixed), batch, "s", views=views
    )
    verdicts["spark"] = [verdict(e) for e in on_spark.expectations]
    assert [v[0] for v in verdicts["pandas"]] == [e["type"] for e in mixed]
    # The last query errs on both engines (an aggregate in WHERE): compare the others.
    assert verdicts["pandas"][:-1] == verdicts["spark"][:-1]
    assert [v[1] for v in verdicts["pandas"]] == [False, True, False, False, False, True, False]
    assert errors[-1] is not None and all(e is None for e in errors[:-1])
    assert not on_spark.expectations[-1].success
    assert on_spark.expectations[-1].error is not None


def test_only_sql_expectations_cache_the_batch_on_spark() -> None:
    between = ("expect_column_values_to_be_between", {"column": "p", "min_value": 0})
    typed = ("expect_column_values_to_be_of_type", {"column": "p", "type_": "LongType"})
    sql = ("unexpected_rows_expectation", {"unexpected_rows_query": "SELECT 1"})
    assert not queries_views([])
    assert not queries_views([between, typed])
    assert queries_views([between, sql])


def test_a_spark_validation_leaves_nothing_cached(spark: SparkSession, tmp_path: Path) -> None:
    """GX's Spark datasource would persist each batch and never release it: a warm worker
    would keep every batch it validated."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    spark.catalog.clearCache()
    batch = spark.createDataFrame(ROWS, SCHEMA)
    suite = ExpectationSuite(name="ranges", expectations=[EXPECTATIONS[2]])
    QualityGate(tmp_path / "gx").validate("t", suite, batch, "run")
    assert not batch.is_cached
    assert spark._jsparkSession.sharedState().cacheManager().isEmpty()


@given(
    kinds=st.lists(st.sampled_from(sorted(IN_MEMORY_EXPECTATIONS)), max_size=5),
    rows=st.integers(min_value=0, max_value=3000),
    limit=st.integers(min_value=0, max_value=3000),
)
def test_the_choice_depends_on_size_and_kinds_alone(
    kinds: list[str], rows: int, limit: int
) -> None:
    numeric = {"column": "c", "min_value": 0, "max_value": 1}
    chosen = choose_batch_engine([(k, numeric) for k in kinds], rows, limit)
    assert chosen.name == ("pandas" if rows <= limit else "spark")
    assert chosen == choose_batch_engine([(k, numeric) for k in kinds], rows, limit)


@pytest.mark.parametrize("bound", [True, "1", dt.date(2024, 1, 1)])
def test_a_range_with_bounds_that_are_not_numbers_stays_on_spark(bound: Any) -> None:
    kwargs = {"column": "c", "min_value": bound}
    assert choose_batch_engine([("expect_column_values_to_be_between", kwargs)], 1, 10).name == (
        "spark"
    )
