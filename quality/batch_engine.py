"""Which Great Expectations engine validates a batch: Spark, or pandas in the driver.

GX computes each expectation's metrics with the execution engine of the batch's
datasource. On Spark every metric bundle is a Spark job (about 0.4 s each on the 2-core
reference machine, several per suite); on pandas the same metrics over a batch the
driver already holds take milliseconds. So a batch is validated in memory when:

- its row count is known (from the Delta log) and at most ``max_rows``, so that collecting
  it costs one Spark job of bounded memory; and
- every expectation of every suite is one whose verdict does not depend on the engine
  (:data:`IN_MEMORY_EXPECTATIONS`): null, set, range, uniqueness, row-count and
  column-name checks. Type checks (``expect_column_values_to_be_of_type`` names Spark
  types) and SQL expectations (``unexpected_rows_expectation`` queries Spark views) keep
  the batch on Spark, and so does a range whose bounds are not numbers (string bounds of a
  date or timestamp column compare differently in pandas).

On Spark, the batch and the audit views are cached for a validation only when a suite
holds a SQL expectation (:func:`caches_on_spark`): GX computes each of those twice (its
rows, then their count) over joins of Delta reads. Column metrics read only their columns
from the batch's Parquet files, so caching every column of the batch first costs more than
it saves: on a 792k-row batch with one range check a validation took 3.7 s cached and
1.0 s without (the cache's materialisation is most of it; interval_cost's equi200k).

Invariant: the choice is a pure function of the suites' expectation types and arguments and
the batch's size; the same inputs always give the same engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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


@dataclass(frozen=True)
class BatchEngine:
    """The engine a batch is validated with, and why."""

    name: Literal["spark", "pandas"]
    reason: str


def choose_batch_engine(
    expectations: Iterable[tuple[str, Mapping[str, Any]]], rows: int | None, max_rows: int
) -> BatchEngine:
    """The engine for a batch of ``rows`` rows checked by ``expectations`` (type, kwargs)."""
    if rows is None:
        return BatchEngine("spark", "the batch's size is not known without a job")
    if rows > max_rows:
        return BatchEngine("spark", f"{rows} rows exceed the in-memory limit of {max_rows}")
    for kind, kwargs in expectations:
        if kind not in IN_MEMORY_EXPECTATIONS:
            return BatchEngine("spark", f"{kind} is checked on Spark")
        if kind in RANGE_EXPECTATIONS and not all(
            _is_number(kwargs.get(bound)) for bound in ("min_value", "max_value")
        ):
            return BatchEngine("spark", f"{kind} on {kwargs.get('column')} has non-numeric bounds")
    return BatchEngine("pandas", f"{rows} rows, every expectation engine-independent")


def caches_on_spark(expectations: Iterable[tuple[str, Mapping[str, Any]]]) -> bool:
    """Whether a validation on Spark caches the batch and the views: only for SQL
    expectations, which GX runs twice each (module docstring)."""
    return any(kind in SQL_EXPECTATIONS for kind, _ in expectations)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))
