"""Delta file statistics (``stats`` of an Add action) from a Parquet file's footer.

Readers skip files by these statistics (``numRecords``, and per column ``minValues``,
``maxValues`` and ``nullCount``; Delta protocol, "Per-file Statistics"), so every bound
written here must hold for every row of the file; a column whose bound cannot be stated
exactly is left out, which only costs skipping, never correctness:

- ``minValues[c] <= v <= maxValues[c]`` for every non-null value ``v`` of ``c``;
- ``nullCount[c]`` is the exact number of nulls of ``c``.

The footer already holds per row-group statistics (Spark's Parquet writer computes them),
so nothing is read but the footer. Rules, after delta-spark's own collection:

- only top-level primitive columns, the first :data:`INDEXED_COLUMNS` of the file (the
  default of ``delta.dataSkippingNumIndexedCols``); nested columns get no statistics;
- a column gets min/max only when every row group with a non-null value has them;
- floating-point columns get no min/max: Parquet statistics leave NaN out, while Spark
  orders NaN above every number, so a footer's maximum is no bound for ``x > 1``;
  booleans and binary get none either;
- strings longer than :data:`STRING_PREFIX` characters: the minimum is its prefix (still a
  lower bound), the maximum is left out;
- timestamps are written with millisecond precision: the minimum rounded down, the maximum
  up, so both stay bounds;
- decimals are written as exact JSON numbers.

Read back (:func:`column_bounds`), only integer and string columns are given bounds, the
types of ids: their log values compare with Python's values of the same column exactly
(a timestamp's text or a float's missing NaN would need more care than skipping is worth).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import types as T

INDEXED_COLUMNS = 32
STRING_PREFIX = 32
_MILLI = dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class ColumnStats:
    """One column's statistics over a whole file; None where no bound is stated."""

    min: Any = None
    max: Any = None
    null_count: int | None = None


def column_stats(metadata: pq.FileMetaData) -> dict[str, ColumnStats]:
    """Per top-level primitive column, the file's min, max and null count (raw values)."""
    columns: dict[str, ColumnStats] = {}
    if metadata.num_row_groups == 0:
        return columns
    first = metadata.row_group(0)
    for index in range(first.num_columns):
        name = first.column(index).path_in_schema
        if "." in name:  # a nested leaf: no statistics, as in delta-spark
            continue
        if len(columns) == INDEXED_COLUMNS:
            break
        chunks = [
            metadata.row_group(group).column(index) for group in range(metadata.num_row_groups)
        ]
        groups = [chunk.statistics for chunk in chunks]
        with_nulls = all(g is not None and g.has_null_count for g in groups)
        # A row group whose values are all null has no min/max and bounds nothing.
        valued = [
            g
            for g, chunk in zip(groups, chunks, strict=True)
            if not (with_nulls and g.null_count == chunk.num_values)
        ]
        with_bounds = bool(valued) and all(g is not None and g.has_min_max for g in valued)
        columns[name] = ColumnStats(
            min=min(g.min for g in valued) if with_bounds else None,
            max=max(g.max for g in valued) if with_bounds else None,
            null_count=sum(g.null_count for g in groups) if with_nulls else None,
        )
    return columns


def _lower_bound(value: Any) -> Any:
    """``value`` as a JSON-able lower bound, or None when none is stated."""
    if isinstance(value, str):
        return value[:STRING_PREFIX]
    if isinstance(value, dt.datetime):
        return _timestamp_text(_millisecond_floor(value))
    return _exact(value)


def _upper_bound(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= STRING_PREFIX else None
    if isinstance(value, dt.datetime):
        floored = _millisecond_floor(value)
        ceiled = floored if floored == value else floored + _MILLI
        return _timestamp_text(ceiled)
    return _exact(value)


def _millisecond_floor(value: dt.datetime) -> dt.datetime:
    return value.replace(microsecond=value.microsecond // 1000 * 1000)


def _exact(value: Any) -> Any:
    if isinstance(value, bool | bytes):
        return None
    if isinstance(value, float):
        return None
    if isinstance(value, int | decimal.Decimal):
        return value
    if isinstance(value, dt.date):
        return value.isoformat()
    return None


def _timestamp_text(value: dt.datetime) -> str:
    text = value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    if value.tzinfo is None:  # TIMESTAMP_NTZ
        return text
    return text + "Z" if value.utcoffset() == dt.timedelta(0) else value.isoformat()


def delta_stats_json(metadata: pq.FileMetaData) -> str:
    """The Add action's ``stats`` for a Parquet file with footer ``metadata``."""
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for name, stats in column_stats(metadata).items():
        if stats.null_count is not None:
            nulls[name] = stats.null_count
        lower = None if stats.min is None else _lower_bound(stats.min)
        upper = None if stats.max is None else _upper_bound(stats.max)
        if lower is not None:
            mins[name] = lower
        if upper is not None:
            maxes[name] = upper
    document: dict[str, Any] = {"numRecords": metadata.num_rows}
    if mins:
        document["minValues"] = mins
    if maxes:
        document["maxValues"] = maxes
    if nulls:
        document["nullCount"] = nulls
    return _dumps(document)


def _dumps(document: dict[str, Any]) -> str:
    """JSON with decimals as exact numbers (``json`` would turn them into floats or fail)."""
    exact: list[str] = []

    def placeholder(value: Any) -> str:
        if isinstance(value, decimal.Decimal):
            exact.append(str(value))
            return f"\x00decimal{len(exact) - 1}\x00"
        raise TypeError(f"cannot write {type(value).__name__} into Delta stats")

    text = json.dumps(document, default=placeholder, separators=(",", ":"))
    for index, number in enumerate(exact):
        text = text.replace(json.dumps(f"\x00decimal{index}\x00"), number)
    return text


# Columns whose log bounds :func:`column_bounds` decodes, with the Python type of a value.
_BOUNDED_TYPES: tuple[tuple[type[T.DataType], type], ...] = (
    (T.ByteType, int),
    (T.ShortType, int),
    (T.IntegerType, int),
    (T.LongType, int),
    (T.StringType, str),
)


def column_bounds(
    schema: T.StructType, min_values: dict[str, Any], max_values: dict[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """Per integer or string column of ``schema``, the (min, max) a file's statistics state
    (``minValues`` / ``maxValues`` of its Add action, keyed by column name); a column with
    either bound missing, or of another type, is left out."""
    bounds: dict[str, tuple[Any, Any]] = {}
    for column in schema.fields:
        kind = next((v for t, v in _BOUNDED_TYPES if isinstance(column.dataType, t)), None)
        low, high = min_values.get(column.name), max_values.get(column.name)
        if kind is None or low is None or high is None:
            continue
        if type(low) is kind and type(high) is kind:  # bool is an int: refused
            bounds[column.name] = (low, high)
    return bounds
