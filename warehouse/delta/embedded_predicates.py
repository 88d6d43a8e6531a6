"""The embedded engine's partition predicates, in the forms each part of a write needs.

A replace or delete names partitions with :class:`~warehouse.delta.api.PartitionFilter`s;
the engine checks them against the table's partitions, tests a DataFrame's rows
(:func:`spark_condition`) or an Arrow table's (:func:`arrow_condition`) against them, and
hands them to delta-rs in its filter form (:func:`delta_filters`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F

from common.errors import DeltaTableError, UnsupportedOperationError
from warehouse.delta.api import PartitionFilter, describe_filters
from warehouse.delta.partition_paths import delta_partition_literal


def spark_condition(where: Sequence[PartitionFilter]) -> Column:
    condition: Column | None = None
    for f in where:
        column = F.col(f.column)
        term = {
            "=": lambda c, v: c == F.lit(v),
            "!=": lambda c, v: c != F.lit(v),
            "<": lambda c, v: c < F.lit(v),
            "<=": lambda c, v: c <= F.lit(v),
            ">": lambda c, v: c > F.lit(v),
            ">=": lambda c, v: c >= F.lit(v),
            "in": lambda c, v: c.isin(list(v)),
            "not in": lambda c, v: ~c.isin(list(v)),
        }[f.op](column, f.value)
        condition = term if condition is None else condition & term
    assert condition is not None
    return condition


def check_partition_predicate(
    root: str, partitions: Sequence[str], where: Sequence[PartitionFilter], operation: str
) -> None:
    """Refuse a replace or delete without a predicate, or with one over data columns."""
    if not where or any(f.column not in partitions for f in where):
        raise UnsupportedOperationError(
            f"{operation} on {root} needs a predicate over partition columns {list(partitions)}; "
            f"got columns {[f.column for f in where]}. Predicates on data columns need the "
            "native delta-spark engine."
        )


def rows_outside(root: str, where: Sequence[PartitionFilter]) -> DeltaTableError:
    return DeltaTableError(
        f"replace on {root}: the data has rows outside the replace predicate "
        f"{describe_filters(where)}; they would survive a later replace of the same range"
    )


def arrow_condition(where: Sequence[PartitionFilter], data: pa.Table) -> pa.ChunkedArray:
    """Where ``data``'s rows satisfy every filter of ``where`` (null: they do not)."""
    condition = None
    for f in where:
        column = data.column(f.column)
        if f.op in ("in", "not in"):
            term = pc.is_in(column, value_set=pa.array(list(f.value), column.type))
            term = pc.invert(term) if f.op == "not in" else term
        else:
            scalar = pa.scalar(f.value, column.type)
            term = {
                "=": pc.equal,
                "!=": pc.not_equal,
                "<": pc.less,
                "<=": pc.less_equal,
                ">": pc.greater,
                ">=": pc.greater_equal,
            }[f.op](column, scalar)
        term = pc.fill_null(term, False)
        condition = term if condition is None else pc.and_(condition, term)
    assert condition is not None
    return condition


def delta_filters(where: Sequence[PartitionFilter]) -> list[tuple[str, str, Any]]:
    return [
        (
            f.column,
            f.op,
            [delta_partition_literal(v) for v in f.value]
            if f.op in ("in", "not in")
            else delta_partition_literal(f.value),
        )
        for f in where
    ]
