"""The native engine's replaces, overwrites and partition deletes.

delta-spark's ``replaceWhere`` replaces the rows of a predicate on any column (rows outside
it are refused), an overwrite replaces the whole table and a DELETE drops partitions; the
predicates are written as Spark SQL, typed for dates and timestamps.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from common.errors import DeltaTableError
from common.sql_text import quoted_identifier, string_literal
from warehouse.delta.api import AppTransaction, CommitOutcome, PartitionFilter, describe_filters
from warehouse.delta.engine import ReplaceScope
from warehouse.delta.native_writes import NativeWrites
from warehouse.delta.partition_paths import delta_partition_literal
from warehouse.delta.table_paths import table_root


class NativeReplaces(NativeWrites):
    """Replace, overwrite and delete_partitions."""

    def _replace(self, root: str, data: DataFrame | pa.Table, scope: ReplaceScope) -> CommitOutcome:
        """``replaceWhere`` (any columns); rows outside the predicate are refused by
        delta-spark, which writes Arrow rows too (one Spark job)."""
        where, txn = scope.where, scope.txn
        frame = self._table_frame(root, self._frame_of(data))
        if not where:
            raise DeltaTableError(f"replace on {root} needs a predicate; use overwrite instead")
        predicate = _sql_predicate(where)
        return self._commit(
            root,
            "replace",
            describe_filters(where),
            txn,
            lambda meta: (
                self._writer(frame, txn, meta)
                .mode("overwrite")
                .option("replaceWhere", predicate)
                .save(root)
            ),
        )

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """A delta-spark DELETE; on partition columns only it removes whole files."""
        root = table_root(path)
        if not where:
            raise DeltaTableError(f"delete_partitions on {root} needs a predicate")
        predicate = _sql_predicate(where)
        table = self._tables.forPath(self._spark, root)

        def delete(meta: str) -> None:
            with self._dml_settings(meta, txn):
                table.delete(predicate)

        return self._commit(root, "delete_partitions", describe_filters(where), txn, delete)

    def overwrite(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        return self._save(path, data, txn, "overwrite", "the whole table")


def _sql_predicate(where: Sequence[PartitionFilter]) -> str:
    return " AND ".join(_sql_term(f) for f in where)


def _sql_term(f: PartitionFilter) -> str:
    column = quoted_identifier(f.column)
    if f.op in ("in", "not in"):
        values = ", ".join(_sql_literal(v) for v in f.value)
        return f"{column} {f.op.upper()} ({values})"
    if f.value is None and f.op in ("=", "!="):
        return f"{column} IS {'' if f.op == '=' else 'NOT '}NULL"
    return f"{column} {f.op} {_sql_literal(f.value)}"


def _sql_literal(value: Any) -> str:
    """A Spark SQL literal of ``value``, typed for dates and timestamps (UTC)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = delta_partition_literal(value)
    assert text is not None
    quoted = string_literal(text)
    if isinstance(value, datetime):
        return f"TIMESTAMP {quoted}"
    if isinstance(value, date):
        return f"DATE {quoted}"
    return quoted
