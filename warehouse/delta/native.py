"""The native Delta engine: delta-spark's ``format("delta")`` when its jars are present.

delta-spark deduplicates app transactions itself (``txnAppId`` / ``txnVersion``), honours
deletion vectors and column mapping, and supports ``replaceWhere`` on any column, so this
engine is a thin mapping of the common API onto it. It is selected automatically on clusters
that ship the jars; there is no Maven access here to fetch them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from common.errors import TableNotFoundError
from warehouse.delta.api import AppTransaction, CommitOutcome, DataFile, PartitionFilter, Snapshot
from warehouse.delta.layout import delta_partition_literal
from warehouse.delta.schema import require_same_definition, require_same_schema

logger = logging.getLogger(__name__)


class NativeDeltaEngine:
    """Delta tables through the delta-spark JVM library."""

    name = "native"

    def __init__(self, session: SparkSession) -> None:
        from delta.tables import DeltaTable as SparkDeltaTable

        self._spark = session
        self._tables = SparkDeltaTable

    def exists(self, path: str) -> bool:
        return bool(self._tables.isDeltaTable(self._spark, path))

    def create_table(
        self,
        path: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> int:
        if self.exists(path):
            return require_same_definition(self.snapshot(path), schema, partition_by)
        builder = self._tables.create(self._spark).location(path).addColumns(schema)
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        for key, value in (properties or {}).items():
            builder = builder.property(key, value)
        builder.execute()
        return 0

    def _detail(self, path: str, version: int | None) -> tuple[int, list[str], dict[str, str]]:
        if not self.exists(path):
            raise TableNotFoundError(f"no Delta table at {path}")
        detail = self._tables.forPath(self._spark, path).detail().first()
        assert detail is not None
        latest = int(self.history(path, 1)[0]["version"])
        return (
            latest if version is None else version,
            list(detail["partitionColumns"]),
            dict(detail["properties"]),
        )

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        frame = self.read(path, version, timestamp)
        resolved, partitions, properties = self._detail(path, version)
        files = frame.inputFiles()
        return Snapshot(
            table_path=path,
            version=resolved,
            schema=frame.schema,
            partition_columns=tuple(partitions),
            files=tuple(DataFile(path=f, size_bytes=0, num_records=None) for f in files),
            properties=properties,
        )

    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        frame = self.read(snapshot.table_path, snapshot.version)
        if files is None:
            return frame
        wanted = [f.path for f in files]
        return frame.where(F.input_file_name().isin(wanted))

    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame:
        reader = self._spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        if timestamp is not None:
            reader = reader.option("timestampAsOf", timestamp.isoformat())
        return reader.load(path)

    def _writer(self, data: DataFrame, txn: AppTransaction | None) -> Any:
        writer = data.write.format("delta")
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        return writer

    def _outcome(self, path: str, txn: AppTransaction | None, before: int | None) -> CommitOutcome:
        version = int(self.history(path, 1)[0]["version"])
        return CommitOutcome(table_version=version, committed=before is None or version > before)

    def append(
        self, path: str, data: DataFrame, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        require_same_schema(path, self.read(path).schema, data.schema)
        before = int(self.history(path, 1)[0]["version"])
        self._writer(data, txn).mode("append").save(path)
        return self._outcome(path, txn, before)

    def replace(
        self,
        path: str,
        data: DataFrame,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        require_same_schema(path, self.read(path).schema, data.schema)
        before = int(self.history(path, 1)[0]["version"])
        predicate = " AND ".join(_sql_term(f) for f in where)
        self._writer(data, txn).mode("overwrite").option("replaceWhere", predicate).save(path)
        return self._outcome(path, txn, before)

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        before = int(self.history(path, 1)[0]["version"])
        empty = self.read(path).limit(0)
        predicate = " AND ".join(_sql_term(f) for f in where)
        self._writer(empty, txn).mode("overwrite").option("replaceWhere", predicate).save(path)
        return self._outcome(path, txn, before)

    def overwrite(
        self, path: str, data: DataFrame, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        require_same_schema(path, self.read(path).schema, data.schema)
        before = int(self.history(path, 1)[0]["version"])
        self._writer(data, txn).mode("overwrite").save(path)
        return self._outcome(path, txn, before)

    def merge(
        self,
        path: str,
        source: DataFrame,
        keys: Sequence[str],
        delete_flag: str | None = None,
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        before = int(self.history(path, 1)[0]["version"])
        if txn is not None and (self.transaction_version(path, txn.app_id) or -1) >= txn.version:
            return CommitOutcome(table_version=before, committed=False)
        columns = self.read(path).schema.fieldNames()
        values: dict[str, str | Column] = {c: f"s.`{c}`" for c in columns}
        builder = (
            self._tables.forPath(self._spark, path)
            .alias("t")
            .merge(source.alias("s"), " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys))
        )
        if delete_flag:
            keep = f"NOT s.`{delete_flag}`"
            builder = builder.whenMatchedDelete(f"s.`{delete_flag}`")
            builder = builder.whenMatchedUpdate(keep, values).whenNotMatchedInsert(keep, values)
        else:
            builder = builder.whenMatchedUpdate(set=values).whenNotMatchedInsert(values=values)
        builder.execute()
        return self._outcome(path, txn, before)

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        table = self._tables.forPath(self._spark, path)
        frame = table.history(limit) if limit else table.history()
        return [row.asDict(recursive=True) for row in frame.collect()]

    def changes(
        self, path: str, after_version: int, to_version: int, added_only: bool = False
    ) -> DataFrame:
        return (
            self._spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", after_version + 1)
            .option("endingVersion", to_version)
            .load(path)
        )

    def transaction_version(self, path: str, app_id: str) -> int | None:
        jvm = self._spark._jvm
        assert jvm is not None
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(self._spark._jsparkSession, path)
        found = log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
        recorded = found.transactions().get(app_id)
        return None if recorded.isEmpty() else int(recorded.get())

    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]:
        # delta-spark has no keep_versions: stretch the retention to cover the oldest pin.
        hours = retention_hours
        if keep_versions:
            oldest = min(keep_versions)
            pinned = [h for h in self.history(path) if int(h["version"]) == oldest + 1]
            if pinned:
                age = datetime.now() - pinned[0]["timestamp"]
                hours = max(hours, age.total_seconds() / 3600 + 1)
        self._spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        self._tables.forPath(self._spark, path).vacuum(hours)
        return []


def _sql_term(f: PartitionFilter) -> str:
    if f.op in ("in", "not in"):
        values = ", ".join(_sql_literal(v) for v in f.value)
        return f"`{f.column}` {f.op.upper()} ({values})"
    return f"`{f.column}` {f.op} {_sql_literal(f.value)}"


def _sql_literal(value: Any) -> str:
    text = delta_partition_literal(value)
    if text is None:
        return "NULL"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return text
    return "'" + text.replace("'", "''") + "'"
