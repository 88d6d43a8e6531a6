"""SQL expectations of a batch validated in memory: Spark SQL queries run by DuckDB.

A suite's ``unexpected_rows_expectation`` holds a Spark SQL query over ``{batch}`` and the
audit views (``quality.audit_views``). GX computes it only on its Spark and SQL engines,
each query twice (its rows, then their count), a Spark job of 0.3-0.7 s each time on the
2-core reference machine. For a batch the audit validates with GX's pandas engine
(``quality.batch_engine``), this module gives that engine the two metrics GX asks for,
``unexpected_rows_query.table`` and ``unexpected_rows_query.row_count``: the query is
translated from Spark SQL to DuckDB's dialect (sqlglot; ``LEFT ANTI JOIN`` becomes
``ANTI JOIN``, for one) and run by an in-process DuckDB over the pandas batch and the views
the gate collected (:func:`views_for_queries`), in milliseconds.

Invariant: over the same rows a query returns the same rows on both engines for the SQL the
suites use (joins, anti and semi joins, grouping, ``count_if``, comparisons, ``LIMIT``);
``tests/quality/test_in_memory_sql.py`` runs each shipped suite query on both and compares.
A query sqlglot cannot translate, or DuckDB cannot run, fails its expectation with the
error (GX records it), never passes.

Importing this module registers the two pandas metrics with GX (GX's metric registry is
keyed by metric and engine, so the Spark and SQL implementations are untouched).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, ClassVar

import duckdb
import pyarrow as pa
from great_expectations.constants import MAX_RESULT_RECORDS
from great_expectations.core.metric_domain_types import MetricDomainTypes
from great_expectations.execution_engine import PandasExecutionEngine
from great_expectations.expectations.metrics.metric_provider import metric_value
from great_expectations.expectations.metrics.query_metric_provider import QueryMetricProvider

from common.errors import ConfigError

# The name the batch has in a translated query (``{batch}`` in the suite's text).
BATCH_RELATION = "__gx_batch"


@dataclass
class _Queries:
    """The views of one validation and the rows each query returned over its batch: GX
    asks for every SQL expectation's rows and then for their count, one query run twice
    (the batch, a pandas frame, is kept with its results so that its id stays its own)."""

    views: Mapping[str, pa.Table]
    results: dict[tuple[str, int], tuple[Any, pa.Table]] = field(default_factory=dict)


# The views of the validation in progress; set only inside :func:`views_for_queries`.
_VIEWS: ContextVar[_Queries | None] = ContextVar("in_memory_sql_views", default=None)


@contextlib.contextmanager
def views_for_queries(views: Mapping[str, pa.Table]) -> Iterator[None]:
    """Make ``views`` (name -> rows) the relations a query may read beside ``{batch}``
    while a validation runs in this context; each query runs once per batch in it."""
    token = _VIEWS.set(_Queries(dict(views)))
    try:
        yield
    finally:
        _VIEWS.reset(token)


@functools.lru_cache(maxsize=256)
def to_duckdb(query: str) -> str:
    """``query`` (Spark SQL, the batch named :data:`BATCH_RELATION`) in DuckDB's dialect."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    try:
        translated = sqlglot.transpile(query, read="spark", write="duckdb")
    except SqlglotError as e:
        raise ConfigError(
            f"unexpected_rows_query is not Spark SQL that can run in memory: {e}; query: {query}"
        ) from e
    if len(translated) != 1:
        raise ConfigError(
            f"unexpected_rows_query: expected one statement, found {len(translated)}: {query}"
        )
    return translated[0]


def run_query(query: str, batch: Any, views: Mapping[str, pa.Table]) -> pa.Table:
    """The rows of ``query`` (Spark SQL naming the batch :data:`BATCH_RELATION`) over
    ``batch`` (a pandas frame) and ``views``."""
    connection = duckdb.connect()
    try:
        connection.register(BATCH_RELATION, batch)
        for name, rows in views.items():
            connection.register(name, rows)
        return connection.sql(to_duckdb(query)).to_arrow_table()
    finally:
        connection.close()


def _query_rows(
    metric: type[QueryMetricProvider] | QueryMetricProvider,
    execution_engine: PandasExecutionEngine,
    metric_domain_kwargs: dict[str, Any],
    metric_value_kwargs: dict[str, Any],
    **_: Any,  # the resolved metrics and the runtime configuration: not used
) -> pa.Table:
    views = _VIEWS.get()
    if views is None:
        raise RuntimeError(
            "an unexpected_rows_expectation was validated in memory outside "
            "quality.in_memory_sql.views_for_queries: its audit views are not available"
        )
    batch, _, _ = execution_engine.get_compute_domain(
        metric_domain_kwargs, domain_type=MetricDomainTypes.TABLE
    )
    query = metric._format_query(
        metric._get_query_from_metric_value_kwargs(metric_value_kwargs), batch=BATCH_RELATION
    )
    key = (query, id(batch))
    if key not in views.results:
        views.results[key] = (batch, run_query(query, batch, views.views))
    return views.results[key][1]


class _InMemoryQueryMetric(QueryMetricProvider):
    """What both metrics share: the expectation's query parameter. Without a
    ``metric_name`` of its own this class registers nothing with GX."""

    value_keys = ("unexpected_rows_query",)
    query_param_name: ClassVar[str] = "unexpected_rows_query"


class InMemoryUnexpectedRowsTable(_InMemoryQueryMetric):
    """``unexpected_rows_query.table`` on GX's pandas engine: the query's first rows."""

    metric_name = "unexpected_rows_query.table"

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(  # GX's metric_value binds it as a class method
        cls,  # noqa: N805
        execution_engine: PandasExecutionEngine,
        **kwargs: Any,
    ) -> list[dict[str, Any]]:
        rows = _query_rows(cls, execution_engine, **kwargs)
        if not kwargs["metric_value_kwargs"].get("fetch_all", False):
            rows = rows.slice(0, MAX_RESULT_RECORDS)
        return rows.to_pylist()


class InMemoryUnexpectedRowsCount(_InMemoryQueryMetric):
    """``unexpected_rows_query.row_count`` on GX's pandas engine."""

    metric_name = "unexpected_rows_query.row_count"

    @metric_value(engine=PandasExecutionEngine)
    def _pandas(  # GX's metric_value binds it as a class method
        cls,  # noqa: N805
        execution_engine: PandasExecutionEngine,
        **kwargs: Any,
    ) -> int:
        return _query_rows(cls, execution_engine, **kwargs).num_rows
