"""Which Great Expectations engine validates a batch: Spark, or pandas in the driver.

GX computes each expectation's metrics with the execution engine of the batch's
datasource. On Spark every metric bundle is a Spark job (about 0.4 s each on the 2-core
reference machine, several per suite), and each SQL expectation two (its rows, then their
count: 0.6-1.3 s together); in the driver the same metrics over a batch already collected
take milliseconds. So a batch is validated in memory when:

- its row count is known (from the Delta log) and at most ``max_rows``, so that collecting
  it costs bounded memory (default 1,000,000: a 2.2M-row SSBJ output of 14 columns, one a
  string, took 0.5 GB as a pandas frame and 1.1 GB of the driver's peak, and was read and
  validated in 1.8 s where GX on Spark took 6.4 s for one range check); and
- every expectation is one the in-memory path computes with the same verdict:
  - null, set, range, uniqueness, row-count and column-name checks
    (:data:`IN_MEMORY_EXPECTATIONS`), by GX's pandas engine;
  - SQL expectations (``unexpected_rows_expectation``), by DuckDB over the collected rows
    and audit views, the query translated from Spark SQL (``quality.in_memory_sql``);
  - checks of Spark types (:data:`SCHEMA_EXPECTATIONS`), by GX's Spark engine against the
    batch's Spark frame, which needs its schema only and reads no row.
  A range whose bounds are not numbers keeps the batch on Spark (string bounds of a date
  or timestamp column compare differently in pandas).

On Spark, the batch and the audit views are cached for a validation only when a suite
holds a SQL expectation (:func:`queries_views`): GX computes each of those twice over
joins of Delta reads. Column metrics read only their columns from the batch's Parquet
files, so caching every column of the batch first costs more than it saves: on a 792k-row
batch with one range check a validation took 3.7 s cached and 1.0 s without (the cache's
materialisation is most of it; interval_cost's equi200k).

Invariant: the choice is a pure function of the suites' expectation types and arguments and
the batch's size; the same inputs always give the same engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql import DataFrame

IN_MEMORY_EXPECTATIONS = frozenset(
    {
        "expect_column_to_exist",
        "expect_column_values_to_be_between",
        "expect_column_values_to_be_in_set",
        "expect_column_values_to_not_be_in_set",
        "expect_column_values_to_be_null",
        "expect_column_values_to_not_be_null",
        "expect_column_values_to_be_unique",
        "expect_compound_columns_to_be_unique",
        "expect_table_columns_to_match_ordered_list",
        "expect_table_columns_to_match_set",
        "expect_table_row_count_to_be_between",
    }
)
RANGE_EXPECTATIONS = frozenset({"expect_column_values_to_be_between"})
# Expectations that query Spark views (the batch and the audit views) with SQL.
SQL_EXPECTATIONS = frozenset({"unexpected_rows_expectation"})
# Expectations on Spark's type names: GX's Spark engine decides them from the schema alone.
SCHEMA_EXPECTATIONS = frozenset(
    {"expect_column_values_to_be_of_type", "expect_column_values_to_be_in_type_list"}
)


@dataclass(frozen=True)
class BatchEngine:
    """The engine a batch is validated with, and why."""

    name: Literal["spark", "pandas"]
    reason: str


@dataclass(frozen=True)
class InMemoryBatch:
    """A batch the caller collected into the driver, validated without Spark jobs.

    ``rows``: the batch; ``schema``: its Spark frame, whose schema the expectations on
    Spark types are checked against (no row is read); ``views``: the relations the
    suite's SQL expectations read beside the batch, by name.
    """

    rows: pd.DataFrame
    schema: DataFrame | None = None
    views: Mapping[str, pa.Table] = field(default_factory=dict)


def choose_batch_engine(
    expectations: Iterable[tuple[str, Mapping[str, Any]]], rows: int | None, max_rows: int
) -> BatchEngine:
    """The engine for a batch of ``rows`` rows checked by ``expectations`` (type, kwargs)."""
    if rows is None:
        return BatchEngine("spark", "the batch's size is not known without a job")
    if rows > max_rows:
        return BatchEngine("spark", f"{rows} rows exceed the in-memory limit of {max_rows}")
    for kind, kwargs in expectations:
        if kind not in IN_MEMORY_EXPECTATIONS | SQL_EXPECTATIONS | SCHEMA_EXPECTATIONS:
            return BatchEngine("spark", f"{kind} is checked on Spark")
        if kind in RANGE_EXPECTATIONS and not all(
            _is_number(kwargs.get(bound)) for bound in ("min_value", "max_value")
        ):
            return BatchEngine("spark", f"{kind} on {kwargs.get('column')} has non-numeric bounds")
    return BatchEngine("pandas", f"{rows} rows, every expectation computable in memory")


def is_schema_expectation(kind: str) -> bool:
    """Whether an in-memory validation checks ``kind`` against the Spark schema."""
    return kind in SCHEMA_EXPECTATIONS


def queries_views(expectations: Iterable[tuple[str, Mapping[str, Any]]]) -> bool:
    """Whether the suites hold SQL expectations, which query the audit views: on Spark the
    batch and the views are then cached (GX runs each query twice; module docstring), in
    memory the views are collected beside the batch."""
    return any(kind in SQL_EXPECTATIONS for kind, _ in expectations)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
