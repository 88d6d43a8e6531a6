"""The embedded Delta engine: Spark writes and reads Parquet, delta-rs owns the log.

Write path (append, replace, merge):

1. Refuse the write unless the data has the table's schema (delta-rs does not check it).
2. Skip it if the table already records the app transaction (delta-rs records app ids but
   does not deduplicate them).
3. Spark executors write Parquet into a fresh, uniquely named directory under the table root.
   Nothing reads those files until the log references them: a crash here leaves untracked
   files that ``vacuum`` removes, never visible rows.
4. The driver commits Add actions with ``DeltaTable.create_write_transaction``. If the
   commit call raises, the log is re-read: an error that surfaced after the commit landed
   (e.g. from a post-commit hook) is recognised by the app transaction and not retried.

Read path: the pinned snapshot's Add actions give the file list and typed partition values;
Spark reads exactly those files, and partition values are attached by file location.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError as DeltaRsTableNotFound
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from common.errors import (
    CommitError,
    DeltaTableError,
    NotAppendOnlyError,
    TableNotFoundError,
    UnsupportedOperationError,
)
from common.faults import crash_point
from warehouse.delta.api import AppTransaction, CommitOutcome, DataFile, PartitionFilter, Snapshot
from warehouse.delta.features import require_readable
from warehouse.delta.layout import (
    delta_partition_literal,
    normalised_location,
    partition_values_from_path,
)
from warehouse.delta.schema import (
    arrow_to_spark,
    require_same_definition,
    require_same_schema,
    spark_to_arrow,
)

logger = logging.getLogger(__name__)

CDF_PROPERTY = "delta.enableChangeDataFeed"
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
_FILE_KEY = "__source_file"


def _table_root(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


class EmbeddedDeltaEngine:
    """Delta tables through delta-rs (log) and Spark (Parquet data)."""

    name = "embedded"

    def __init__(self, session: SparkSession, max_commit_retries: int = 15) -> None:
        self._spark = session
        self._max_commit_retries = max_commit_retries
        # Row counts of the files this engine wrote, read from their footers at write time.
        self._rows_in_file: dict[str, int] = {}

    # ------------------------------------------------------------------ table handles

    def _open(self, path: str, version: int | None = None) -> DeltaTable:
        root = _table_root(path)
        try:
            table = DeltaTable(root, version=version)
        except DeltaRsTableNotFound as e:
            raise TableNotFoundError(f"no Delta table at {root}") from e
        except Exception as e:
            raise DeltaTableError(
                f"cannot open Delta table {root} at version {version}: {e}"
            ) from e
        protocol = table.protocol()
        require_readable(
            root,
            protocol.min_reader_version,
            protocol.reader_features,
            table.metadata().configuration,
        )
        return table

    def exists(self, path: str) -> bool:
        return DeltaTable.is_deltatable(_table_root(path))

    def create_table(
        self,
        path: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> int:
        """Create the table, or accept an existing one with the same schema and partitioning."""
        root = _table_root(path)
        if self.exists(root):
            return require_same_definition(self.snapshot(root), schema, partition_by)
        unknown = [c for c in partition_by if c not in schema.fieldNames()]
        if unknown:
            raise DeltaTableError(
                f"partition columns {unknown} of {root} are not in the schema {schema.fieldNames()}"
            )
        DeltaTable.create(
            root,
            spark_to_arrow(schema),
            partition_by=list(partition_by) or None,
            configuration=dict(properties or {}),
        )
        logger.info("created Delta table %s partitioned by %s", root, list(partition_by))
        return 0

    # ------------------------------------------------------------------ reads

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        root = _table_root(path)
        table = self._open(root, version)
        if timestamp is not None:
            table.load_as_version(timestamp)
        return self._snapshot_of(root, table)

    def _snapshot_of(self, root: str, table: DeltaTable) -> Snapshot:
        metadata = table.metadata()
        partitions = tuple(metadata.partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        files = tuple(
            DataFile(
                path=self._data_file_location(root, action["path"]),
                size_bytes=int(action["size_bytes"]),
                num_records=action.get("num_records"),
                partition_values={c: action.get(f"partition.{c}") for c in partitions},
            )
            for action in actions
        )
        return Snapshot(
            table_path=root,
            version=table.version(),
            schema=arrow_to_spark(table.schema().to_arrow()),
            partition_columns=partitions,
            files=files,
            properties={k: v for k, v in metadata.configuration.items() if v is not None},
        )

    @staticmethod
    def _data_file_location(root: str, log_path: str) -> str:
        # The log stores RFC 2396-encoded paths, relative to the root unless absolute.
        decoded = unquote(log_path)
        if "://" in decoded or decoded.startswith("/"):
            return decoded
        return f"{root.rstrip('/')}/{decoded}"

    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        chosen = snapshot.files if files is None else tuple(files)
        columns = snapshot.schema.fieldNames()
        if not chosen:
            return self._spark.createDataFrame([], snapshot.schema)
        partitions = snapshot.partition_columns
        data_schema = StructType([f for f in snapshot.schema.fields if f.name not in partitions])
        frame = self._spark.read.schema(data_schema).parquet(*[f.path for f in chosen])
        if not partitions:
            return frame.select(*columns)
        lookup_schema = StructType(
            [StructField(_FILE_KEY, StringType(), False)] + [snapshot.schema[c] for c in partitions]
        )
        lookup = self._spark.createDataFrame(
            [
                (normalised_location(f.path), *[f.partition_values.get(c) for c in partitions])
                for f in chosen
            ],
            lookup_schema,
        )
        return (
            frame.withColumn(_FILE_KEY, _decoded_file_location())
            .join(F.broadcast(lookup), _FILE_KEY)
            .select(*columns)
        )

    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame:
        return self.read_files(self.snapshot(path, version, timestamp))

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        return list(self._open(path).history(limit))

    def transaction_version(self, path: str, app_id: str) -> int | None:
        return self._open(path).transaction_version(app_id)

    def changes(
        self, path: str, after_version: int, to_version: int, added_only: bool = False
    ) -> DataFrame:
        """Rows added or changed in versions ``(after_version, to_version]``.

        Uses the change data feed when the table enables it. Otherwise the table must have
        been append-only over the range, and the answer is the rows of the files added,
        tagged ``insert``; a file removed in the range raises :class:`NotAppendOnlyError`,
        unless ``added_only`` says the caller wants the added rows regardless (a stage
        reading its input: replaced partitions are a backfill's business, not the live
        stage's).
        """
        if to_version < after_version:
            raise DeltaTableError(
                f"changes of {path}: to_version {to_version} is before after_version "
                f"{after_version}"
            )
        root = _table_root(path)
        table = self._open(root, to_version)
        end = self._snapshot_of(root, table)
        change_schema = StructType(
            [
                *end.schema.fields,
                StructField(CHANGE_TYPE, StringType(), False),
                StructField(COMMIT_VERSION, LongType(), False),
            ]
        )
        if to_version == after_version:
            return self._spark.createDataFrame([], change_schema)
        if end.properties.get(CDF_PROPERTY, "false").lower() == "true":
            feed = pa.RecordBatchReader.from_stream(
                table.load_cdf(starting_version=after_version + 1, ending_version=to_version)
            ).read_all()
            # delta-rs answers with view and unsigned types that Spark cannot convert.
            target = spark_to_arrow(change_schema)
            feed = feed.select(target.names).cast(target)
            return self._spark.createDataFrame(feed, change_schema)
        return self._appended_rows(root, after_version, end, change_schema, added_only)

    def _appended_rows(
        self,
        root: str,
        after_version: int,
        end: Snapshot,
        change_schema: StructType,
        added_only: bool,
    ) -> DataFrame:
        walker = self._open(root, after_version)
        previous = {f.path: f for f in self._snapshot_of(root, walker).files}
        parts: list[DataFrame] = []
        for version in range(after_version + 1, end.version + 1):
            walker.load_as_version(version)
            current = {f.path: f for f in self._snapshot_of(root, walker).files}
            removed = previous.keys() - current.keys()
            if removed and not added_only:
                raise NotAppendOnlyError(
                    f"table {root} removed {len(removed)} file(s) in version {version} and does "
                    f"not enable {CDF_PROPERTY}; its changes cannot be derived from added files. "
                    f"Set {CDF_PROPERTY}=true on the table."
                )
            added = [current[p] for p in current.keys() - previous.keys()]
            if added:
                parts.append(
                    self.read_files(end, added)
                    .withColumn(CHANGE_TYPE, F.lit("insert"))
                    .withColumn(COMMIT_VERSION, F.lit(version).cast(LongType()))
                )
            previous = current
        if not parts:
            return self._spark.createDataFrame([], change_schema)
        result = parts[0]
        for part in parts[1:]:
            result = result.unionByName(part)
        return result

    # ------------------------------------------------------------------ writes

    def append(
        self, path: str, data: DataFrame, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        return self._write(path, data, "append", None, txn)

    def _write(
        self,
        path: str,
        data: DataFrame,
        mode: str,
        where: Sequence[PartitionFilter] | None,
        txn: AppTransaction | None,
    ) -> CommitOutcome:
        """Check the schema, skip a landed transaction, write Parquet, commit Add actions."""
        root = _table_root(path)
        table = self._open(root)
        schema = arrow_to_spark(table.schema().to_arrow())
        require_same_schema(root, schema, data.schema)
        skipped = self._skip_if_committed(root, table, txn)
        if skipped:
            return skipped
        partitions = list(table.metadata().partition_columns)
        adds = self._write_files(root, data.select(*schema.fieldNames()), partitions)
        return self._commit(
            root,
            table,
            adds=adds,
            mode=mode,
            schema=schema,
            partitions=partitions,
            filters=_delta_filters(where) if where else None,
            txn=txn,
        )

    def replace(
        self,
        path: str,
        data: DataFrame,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Atomically replace the rows of the partitions selected by ``where`` with ``data``."""
        root = _table_root(path)
        self._require_partition_predicate(root, where, "replace")
        outside = data.filter(~F.coalesce(_spark_condition(where), F.lit(False))).limit(1)
        if outside.count():
            raise DeltaTableError(
                f"replace on {root}: the data has rows outside the replace predicate "
                f"{_describe(where)}; they would survive a later replace of the same range"
            )
        return self._write(path, data, "overwrite", where, txn)

    def _require_partition_predicate(
        self, root: str, where: Sequence[PartitionFilter], operation: str
    ) -> list[str]:
        partitions = list(self._open(root).metadata().partition_columns)
        if not where or any(f.column not in partitions for f in where):
            raise UnsupportedOperationError(
                f"{operation} on {root} needs a predicate over partition columns {partitions}; "
                f"got columns {[f.column for f in where]}. Predicates on data columns need the "
                "native delta-spark engine."
            )
        return partitions

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        root = _table_root(path)
        partitions = self._require_partition_predicate(root, where, "delete_partitions")
        table = self._open(root)
        skipped = self._skip_if_committed(root, table, txn)
        if skipped:
            return skipped
        return self._commit(
            root,
            table,
            adds=[],
            mode="overwrite",
            schema=arrow_to_spark(table.schema().to_arrow()),
            partitions=partitions,
            filters=_delta_filters(where),
            txn=txn,
        )

    def overwrite(
        self, path: str, data: DataFrame, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        return self._write(path, data, "overwrite", None, txn)

    def merge(
        self,
        path: str,
        source: DataFrame,
        keys: Sequence[str],
        delete_flag: str | None = None,
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Upsert ``source`` by ``keys``; rows whose ``delete_flag`` is true delete the match.

        The source travels to the driver as Arrow, so this is meant for master-data
        maintenance batches, not for bulk loads (use ``append`` for those).
        """
        root = _table_root(path)
        table = self._open(root)
        schema = arrow_to_spark(table.schema().to_arrow())
        payload = source.drop(delete_flag) if delete_flag else source
        require_same_schema(root, schema, payload.schema)
        if not keys:
            raise DeltaTableError(f"merge into {root} needs at least one key column")
        skipped = self._skip_if_committed(root, table, txn)
        if skipped:
            return skipped
        columns = schema.fieldNames()
        arrow = source.select(*columns, *([delete_flag] if delete_flag else [])).toArrow()
        values = {c: f"s.`{c}`" for c in columns}
        builder = table.merge(
            arrow,
            predicate=" AND ".join(f"t.`{k}` = s.`{k}`" for k in keys),
            source_alias="s",
            target_alias="t",
            commit_properties=self._commit_properties(txn),
        )
        if delete_flag:
            keep = f"NOT s.`{delete_flag}`"
            builder = builder.when_matched_delete(predicate=f"s.`{delete_flag}`")
            builder = builder.when_matched_update(values, predicate=keep)
            builder = builder.when_not_matched_insert(values, predicate=keep)
        else:
            builder = builder.when_matched_update(values).when_not_matched_insert(values)
        try:
            metrics = builder.execute()
        except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
            return self._recover_or_raise(root, txn, e)
        logger.info("merged into %s: %s", root, metrics)
        return CommitOutcome(table_version=self._open(root).version(), committed=True)

    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]:
        """Delete unreferenced files older than the retention, except those of kept versions.

        ``full`` mode also removes untracked Parquet left by killed writers. Keep the
        retention longer than the longest write, so an in-flight write is never cleaned.
        """
        table = self._open(path)
        deleted = table.vacuum(
            retention_hours=int(retention_hours),
            dry_run=False,
            enforce_retention_duration=False,
            full=True,
            keep_versions=sorted(set(keep_versions)) or None,
        )
        logger.info("vacuumed %s: %d file(s) deleted", path, len(deleted))
        return list(deleted)

    # ------------------------------------------------------------------ commit helpers

    def _skip_if_committed(
        self, root: str, table: DeltaTable, txn: AppTransaction | None
    ) -> CommitOutcome | None:
        if txn is None:
            return None
        recorded = table.transaction_version(txn.app_id)
        if recorded is not None and recorded >= txn.version:
            logger.info(
                "skip commit to %s: app %s already at version %s (asked %s)",
                root,
                txn.app_id,
                recorded,
                txn.version,
            )
            return CommitOutcome(table_version=table.version(), committed=False)
        return None

    def _commit_properties(self, txn: AppTransaction | None) -> CommitProperties:
        return CommitProperties(
            max_commit_retries=self._max_commit_retries,
            app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None,
        )

    def _write_files(self, root: str, data: DataFrame, partitions: list[str]) -> list[AddAction]:
        prefix = uuid.uuid4().hex[:20]
        staging = f"{root.rstrip('/')}/{prefix}"
        writer = data.write.mode("errorifexists")
        if partitions:
            writer = writer.partitionBy(*partitions)
        writer.parquet(staging)
        filesystem, base = (
            pafs.FileSystem.from_uri(staging)
            if "://" in staging
            else (
                pafs.LocalFileSystem(),
                staging,
            )
        )
        infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
        now_ms = int(datetime.now().timestamp() * 1000)
        adds = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            relative = os.path.relpath(info.path, base)
            with filesystem.open_input_file(info.path) as handle:
                rows = pq.read_metadata(handle).num_rows
            self._rows_in_file[f"{prefix}/{relative}"] = rows
            adds.append(
                AddAction(
                    path=f"{prefix}/{relative}",
                    size=int(info.size or 0),
                    partition_values=partition_values_from_path(os.path.dirname(relative)),
                    modification_time=now_ms,
                    data_change=True,
                    stats=f'{{"numRecords": {rows}}}',
                )
            )
        logger.debug("wrote %d file(s) under %s", len(adds), staging)
        return adds

    def _commit(
        self,
        root: str,
        table: DeltaTable,
        *,
        adds: list[AddAction],
        mode: str,
        schema: StructType,
        partitions: list[str],
        filters: list[tuple[str, str, Any]] | None,
        txn: AppTransaction | None,
    ) -> CommitOutcome:
        if not adds and txn is None and mode == "append":
            return CommitOutcome(table_version=table.version(), committed=False)
        crash_point("delta.before_commit")
        actions: list[AddAction | RemoveAction] = list(adds)
        try:
            table.create_write_transaction(
                actions,
                mode=mode,
                schema=spark_to_arrow(schema),
                partition_by=partitions or None,
                partition_filters=filters,
                commit_properties=self._commit_properties(txn),
            )
        except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
            return self._recover_or_raise(root, txn, e, adds)
        crash_point("delta.after_commit")
        version = self._open(root).version()
        logger.info("committed %d file(s) to %s at version %d", len(adds), root, version)
        return CommitOutcome(
            table_version=version,
            committed=True,
            files_added=len(adds),
            bytes_added=sum(a.size for a in adds),
            rows_added=sum(self._rows_in_file.pop(a.path, 0) for a in adds),
        )

    def _recover_or_raise(
        self,
        root: str,
        txn: AppTransaction | None,
        error: Exception,
        adds: Sequence[AddAction] = (),
    ) -> CommitOutcome:
        """Treat an error as success only if the log shows the transaction landed."""
        if txn is not None:
            table = self._open(root)
            recorded = table.transaction_version(txn.app_id)
            if recorded is not None and recorded >= txn.version:
                logger.warning(
                    "commit to %s raised %r after it landed (app %s version %s); not retrying",
                    root,
                    error,
                    txn.app_id,
                    txn.version,
                )
                return CommitOutcome(
                    table_version=table.version(),
                    committed=True,
                    files_added=len(adds),
                    bytes_added=sum(a.size for a in adds),
                )
        raise CommitError(
            f"commit to {root} failed and did not land: {error}. The written files stay "
            "untracked and are removed by vacuum; rerunning the step is safe."
        ) from error


def _decoded_file_location() -> Column:
    # Spark reports the file as an RFC 2396 URI; '+' is literal there, so protect it before
    # url_decode (which would read it as a space), then drop the scheme like the Python side.
    decoded = F.url_decode(F.replace(F.col("_metadata.file_path"), F.lit("+"), F.lit("%2B")))
    return F.concat(F.lit("/"), F.regexp_replace(decoded, r"^[A-Za-z][A-Za-z0-9+.-]*:/*", ""))


def _spark_condition(where: Sequence[PartitionFilter]) -> Column:
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


def _delta_filters(where: Sequence[PartitionFilter]) -> list[tuple[str, str, Any]]:
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


def _describe(where: Sequence[PartitionFilter]) -> str:
    return " AND ".join(f"{f.column} {f.op} {f.value!r}" for f in where)
