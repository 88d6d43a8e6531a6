"""The native engine's appends and merges, through delta-spark's writer and merge builder.

Data is written by name in the table's column order (refused unless it has exactly the
table's columns); each call is one commit of :mod:`~warehouse.delta.native_commits`.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql.types import StructType

from warehouse.delta.api import AppTransaction, CommitOutcome
from warehouse.delta.engine import MergeOn, Txn
from warehouse.delta.native_commits import NativeCommits
from warehouse.delta.native_snapshots import logical_schema
from warehouse.delta.schema import require_merge_source, require_same_schema
from warehouse.delta.table_paths import table_root


class NativeWrites(NativeCommits):
    """Appends (DataFrame or Arrow rows) and merges by key."""

    def _writer(self, data: DataFrame, txn: AppTransaction | None, user_metadata: str) -> Any:
        writer = data.write.format("delta").option("userMetadata", user_metadata)
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        return writer

    def _schema(self, root: str) -> StructType:
        """The newest version's schema, from the log's metadata alone (no file listing)."""
        stored = self._jsnapshot(root).schema().json()
        return logical_schema(StructType.fromJson(json.loads(stored)))

    def _table_frame(self, root: str, data: DataFrame) -> DataFrame:
        """``data`` with the table's columns in the table's order; refused unless it has
        exactly those columns (a write by name must not add, drop or retype one)."""
        schema = self._schema(root)
        require_same_schema(root, schema, data.schema)
        return data.select(*schema.fieldNames())

    def _frame_of(self, data: DataFrame | pa.Table) -> DataFrame:
        """``data`` as a Spark frame: delta-spark writes only those (Arrow rows: one job)."""
        return self._spark.createDataFrame(data) if isinstance(data, pa.Table) else data

    def _append(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None
    ) -> CommitOutcome:
        return self._save(path, data, txn, "append", "the table")

    def _save(
        self,
        path: str,
        data: DataFrame | pa.Table,
        txn: AppTransaction | None,
        mode: str,
        what: str,
    ) -> CommitOutcome:
        """A DataFrame writer's save in ``mode`` (``append``, ``overwrite``) of ``what``."""
        root = table_root(path)
        frame = self._table_frame(root, self._frame_of(data))
        return self._commit(
            root,
            mode,
            what,
            txn,
            lambda meta: self._writer(frame, txn, meta).mode(mode).save(root),
        )

    def _merge(self, root: str, source: DataFrame, on: MergeOn, txn: Txn) -> CommitOutcome:
        """delta-spark's merge builder, the settings of ``txn`` around its one commit."""
        keys, delete_flag = on.keys, on.delete_flag
        schema = self._schema(root)
        require_merge_source(root, schema, source, keys, delete_flag)
        values: dict[str, str | Column] = {c: f"s.`{c}`" for c in schema.fieldNames()}
        builder = (
            self._tables.forPath(self._spark, root)
            .alias("t")
            .merge(source.alias("s"), " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys))
        )
        if delete_flag:
            keep = f"NOT s.`{delete_flag}`"
            builder = builder.whenMatchedDelete(f"s.`{delete_flag}`")
            builder = builder.whenMatchedUpdate(keep, values).whenNotMatchedInsert(keep, values)
        else:
            builder = builder.whenMatchedUpdate(set=values).whenNotMatchedInsert(values=values)

        def execute(meta: str) -> None:
            with self._dml_settings(meta, txn):
                builder.execute()

        return self._commit(root, "merge", f"keys {list(keys)}", txn, execute)
