"""The embedded Delta engine: Spark (or pyarrow in the driver) writes and reads Parquet,
delta-rs owns the log.

Write path (append, replace, overwrite, delete_partitions, merge):

1. Refuse the write unless the data has the table's schema (delta-rs does not check it).
2. Skip it if the table already records the app transaction (delta-rs records app ids but
   does not deduplicate them).
3. Write Parquet into a fresh, uniquely named directory under the table root
   (:mod:`~warehouse.delta.embedded_writes`); untracked until committed.
4. The optional ``commit_guard`` runs (it raises, e.g., when this process lost the pipeline
   lease; nothing is committed then). delta-rs writes and commits a merge in one call, so
   for merge the guard runs just before that call.
5. The driver commits: by writing the commit file itself where the table allows it, else
   through delta-rs (:mod:`~warehouse.delta.embedded_commits`); replaces and overwrites
   under a conflict check (:mod:`~warehouse.delta.embedded_replace`).

Read path: the pinned snapshot's Add actions give the file list and typed partition values
(:mod:`~warehouse.delta.embedded_reads`); Spark reads exactly those files. What the engine
has read of each table's log (tips, snapshots, commit files) is kept per version and
shared by the engines of a process (:mod:`~warehouse.delta.embedded_tip`).

This module holds the engine's calls; the parts above hold the work, each with explicit
inputs (the engine's caches, its clock and commit settings).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Unpack

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import CommitProperties
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from common.phase_clock import optional_phase
from warehouse.delta.api import (
    AppTransaction,
    CommitOutcome,
    DataFile,
    PartitionFilter,
    Snapshot,
)
from warehouse.delta.commit_protocol import COMMIT_ID_KEY, tagged_metadata
from warehouse.delta.embedded_commits import Committer, skip_if_committed
from warehouse.delta.embedded_predicates import (
    arrow_condition,
    check_partition_predicate,
    rows_outside,
    spark_condition,
)
from warehouse.delta.embedded_reads import (
    Snapshots,
    arrow_by_version,
    arrow_of_files,
    change_feed,
    read_files,
)
from warehouse.delta.embedded_replace import replace_at_tip
from warehouse.delta.embedded_tip import ReadCaches, TableTips
from warehouse.delta.embedded_writes import (
    NOTHING_WRITTEN,
    link_files,
    write_data,
    write_one_file,
)
from warehouse.delta.engine import (
    AddedRange,
    ArrowRead,
    DeltaEngine,
    EngineSettings,
    FileActions,
    MergeOn,
    NewTable,
    RangeEnd,
    ReplaceScope,
    Txn,
)
from warehouse.delta.schema import (
    arrow_to_spark,
    require_merge_source,
    require_same_schema,
    spark_to_arrow,
)
from warehouse.delta.table_paths import table_root
from warehouse.object_store import storage_options

logger = logging.getLogger(__name__)
# Keys delta-rs generates or constrains in commitInfo; caller metadata must not shadow them.
_RESERVED_COMMIT_INFO_KEYS = frozenset(
    {
        COMMIT_ID_KEY,
        "timestamp",
        "operation",
        "operationParameters",
        "engineInfo",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
    }
)


class EmbeddedDeltaEngine(DeltaEngine[DataFile]):
    """Delta tables through delta-rs (log) and Spark (Parquet data); a file action's payload
    is the file as a snapshot lists it."""

    name = "embedded"
    arrow_in_driver = True
    _reserved_commit_keys = _RESERVED_COMMIT_INFO_KEYS

    def __init__(
        self,
        session: SparkSession,
        max_commit_retries: int = 15,
        *,
        write_log: bool = True,
        caches: ReadCaches | None = None,
        **settings: Unpack[EngineSettings],
    ) -> None:
        super().__init__(session, **settings)
        self._max_commit_retries = max_commit_retries
        caches = ReadCaches() if caches is None else caches
        # Each table's tip, its delta-rs handle, and the commit files parsed once.
        self._tips = TableTips(caches)
        # Snapshots by (root, version), each read from the log once.
        self._snapshots = Snapshots(caches.snapshots, self._tips)
        # Commit this engine's appends and partition overwrites by writing their commit
        # files (``log_writer``) where the table's protocol allows it; delta-rs otherwise.
        self._write_log = write_log

    def _committer(self) -> Committer:
        """How a call commits; made per call, as the clock, commit guard and commit metadata
        are the engine's settings of the moment."""
        return Committer(
            tips=self._tips,
            snapshots=self._snapshots,
            clock=self.clock,
            check_guard=self._check_commit_guard,
            metadata=self.commit_metadata,
            max_commit_retries=self._max_commit_retries,
            write_log=self._write_log,
        )

    # ------------------------------------------------------------------ tables

    def exists(self, path: str) -> bool:
        """A table of which this engine holds a version whose commit file is still that
        file exists (a stat); otherwise delta-rs looks (2 ms, several times a step)."""
        root = table_root(path)
        return (
            self._snapshots.cache.holds(root)
            or self._tips.cache.holds(root)
            or DeltaTable.is_deltatable(root, storage_options=storage_options(root))
        )

    def _definition(self, root: str) -> Snapshot:
        return self._snapshots.definition(root)

    def _create(self, root: str, table: NewTable) -> bool:
        DeltaTable.create(
            root,
            spark_to_arrow(table.schema),
            partition_by=list(table.partition_by) or None,
            configuration=dict(table.configuration),
            storage_options=storage_options(root),
        )
        return True

    def _latest_version(self, root: str) -> int:
        return self._tips.tip(root).table_version

    # ------------------------------------------------------------------ reads

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        return self._snapshots.snapshot(path, version, timestamp)

    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        """The rows of ``files`` (all of the snapshot's by default) with the snapshot's
        schema; partition values come from the log, not the paths
        (:func:`~warehouse.delta.embedded_reads.read_files`)."""
        return read_files(self._spark, snapshot, files)

    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame:
        return self.read_files(self.snapshot(path, version, timestamp))

    def _read_arrow(self, read: ArrowRead) -> pa.Table:
        """Reads the files with pyarrow in the driver (only the columns asked for, each file
        filtered as it is read): no Spark job."""
        files = read.snapshot.files if read.files is None else read.files
        return arrow_of_files(read.snapshot, files, read.columns, read.where)

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        return list(self._tips.open(path).history(limit))

    def transaction_version(self, path: str, app_id: str) -> int | None:
        return self._tips.tip(table_root(path)).transaction_version(app_id)

    def _range_end(self, root: str, version: int) -> RangeEnd[DataFile]:
        end = self.snapshot(root, version)
        return RangeEnd(end, lambda files: self.read_files(end, files))

    def _change_feed(
        self, root: str, after_version: int, to_version: int, schema: StructType
    ) -> DataFrame:
        """delta-rs's ``load_cdf``, in the driver's memory, handed to Spark."""
        table = self._tips.open(root, to_version)
        return change_feed(self._spark, table, after_version, to_version, schema)

    def _file_actions(
        self, root: str, after_version: int, to_version: int
    ) -> FileActions[DataFile]:
        return self._snapshots.file_actions(root, after_version, to_version)

    def _live_records(self, payload: DataFile) -> int | None:
        """The file's ``numRecords`` (the embedded engine refuses deletion vectors, so a
        live file's rows are all its records)."""
        return payload.num_records

    def _added_arrow(self, added: AddedRange, with_version: bool) -> pa.Table:
        """Reads the added files with pyarrow in the driver: no Spark job. Partition values
        come from the log, as :meth:`read_files` attaches them."""
        end, by_version = self._added_by_version(added)
        return arrow_by_version(end.snapshot, by_version, with_version)

    def rows_by_version(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, int]]:
        """From each version's commit file: one small read per version, where replaying
        snapshots would cost a file listing each."""
        return self._snapshots.rows_by_version(table_root(path), after_version, to_version)

    def commit_infos(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, Mapping[str, Any]]]:
        """From each version's commit file (parsed once per version); a commit file log
        retention removed falls back to the history."""
        root = table_root(path)
        try:
            return [
                (version, self._tips.commit(root, version).info)
                for version in range(after_version + 1, to_version + 1)
            ]
        except FileNotFoundError:
            return super().commit_infos(root, after_version, to_version)

    # ------------------------------------------------------------------ writes

    def _append(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None
    ) -> CommitOutcome:
        """Spark writes a frame's files, pyarrow an Arrow table's on the driver (a file per
        partition, no Spark job)."""
        return self._write(path, data, None, txn)

    def _append_in_driver(
        self, root: str, rows: Sequence[tuple[Any, ...]], schema: StructType, txn: Txn
    ) -> CommitOutcome | None:
        """Writes one Parquet file with pyarrow on the driver: no Spark job for a few rows.
        A partitioned table takes the ordinary (Spark) append."""
        tip = self._tips.tip(root)
        if tip.partition_columns:
            return None
        existing = tip.schema
        require_same_schema(root, existing, schema)
        commit_id = self._new_commit_id()
        skipped = skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        data = pa.Table.from_pylist(
            [dict(zip(schema.fieldNames(), row, strict=True)) for row in rows],
            spark_to_arrow(existing),
        )
        written = write_one_file(root, data, self.clock)
        return self._committer().commit_append(root, tip, written, existing, [], txn, commit_id)

    def _append_files_added(
        self, added: AddedRange, target: str, txn: Txn, partition_by: Sequence[str] | None
    ) -> CommitOutcome:
        """Adds the source's live files to ``target`` without a Spark job.

        The rows :meth:`rows_added` returns are whole files (Parquet files are immutable and
        the embedded engine refuses deletion vectors), so the files themselves are added:
        hard-linked into a fresh directory under the target's root (copied where a link
        cannot be made: another file system, an object store), their statistics taken from
        their footers, and committed like an append. A hard link is a second name of the
        same bytes: vacuuming either table later removes only its own name. Where the two
        tables are partitioned differently the rows are read and written as an append.
        """
        range_end, by_version = self._added_by_version(added)
        end = range_end.snapshot
        if partition_by is not None:
            self.create_table(target, end.schema, partition_by)
        root = table_root(target)
        tip = self._tips.tip(root)
        schema = tip.schema
        require_same_schema(root, schema, end.schema)
        files = [f for files in by_version.values() for f in files]
        partitions = list(tip.partition_columns)
        if partitions != list(end.partition_columns):
            return self._write(root, self.read_files(end, files), None, txn)
        commit_id = self._new_commit_id()
        skipped = skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        with optional_phase(self.clock, "write"):
            written = link_files(end.table_path, files, root, partitions)
        committer = self._committer()
        return committer.commit_append(root, tip, written, schema, partitions, txn, commit_id)

    def _write(
        self,
        path: str,
        data: DataFrame | pa.Table,
        where: Sequence[PartitionFilter] | None,
        txn: AppTransaction | None,
        operation: str = "append",
    ) -> CommitOutcome:
        """Check the schema, skip a landed transaction, write Parquet, commit Add actions.

        ``operation`` other than ``append`` replaces the files ``where`` selects (all files
        when ``where`` is None) with the data's, under the replace concurrency check. Spark
        writes a DataFrame's files, pyarrow an Arrow table's.
        """
        root = table_root(path)
        tip = self._tips.tip(root)
        schema = tip.schema
        data_schema = arrow_to_spark(data.schema) if isinstance(data, pa.Table) else data.schema
        require_same_schema(root, schema, data_schema)
        commit_id = self._new_commit_id()
        skipped = skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        partitions = list(tip.partition_columns)
        if where is not None:
            check_partition_predicate(root, partitions, where, operation)
        committer = self._committer()
        if operation == "append":
            written = write_data(root, data, schema, partitions, self.clock)
            return committer.commit_append(root, tip, written, schema, partitions, txn, commit_id)
        # The files the replace removes, as of the version it was asked against: taken before
        # the Parquet write, so a concurrent change during the write is caught at commit.
        scope = committer.own_scope(root, tip, where)
        written = write_data(root, data, schema, partitions, self.clock)
        if scope is not None:
            own = committer.commit_own(root, tip, written, scope, txn, commit_id)
            if own is not None:
                return own
        return replace_at_tip(
            committer, root, tip, written, schema, partitions, where, txn, commit_id, operation
        )

    def _replace(self, root: str, data: DataFrame | pa.Table, scope: ReplaceScope) -> CommitOutcome:
        """Raises :class:`ConcurrentModificationError`, committing nothing, when another
        writer added or removed files in those partitions after this call opened the table."""
        where = scope.where
        self._require_partition_predicate(root, where, "replace")
        if isinstance(data, pa.Table):
            outside = bool(data.num_rows) and not pc.all(arrow_condition(where, data)).as_py()
        else:
            condition = ~F.coalesce(spark_condition(where), F.lit(False))
            outside = bool(data.filter(condition).limit(1).count())
        if outside:
            raise rows_outside(root, where)
        return self._write(root, data, where, scope.txn, "replace")

    def _require_partition_predicate(
        self, root: str, where: Sequence[PartitionFilter], operation: str
    ) -> list[str]:
        partitions = list(self._tips.tip(root).partition_columns)
        check_partition_predicate(root, partitions, where, operation)
        return partitions

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        root = table_root(path)
        partitions = self._require_partition_predicate(root, where, "delete_partitions")
        tip = self._tips.tip(root)
        commit_id = self._new_commit_id()
        skipped = skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        committer = self._committer()
        scope = committer.own_scope(root, tip, where)
        if scope is not None:
            own = committer.commit_own(root, tip, NOTHING_WRITTEN, scope, txn, commit_id)
            if own is not None:
                return own
        return replace_at_tip(
            committer,
            root,
            tip,
            NOTHING_WRITTEN,
            None,
            partitions,
            where,
            txn,
            commit_id,
            "delete_partitions",
        )

    def overwrite(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """Replace every row; conflicts with any file change after the table was opened."""
        return self._write(path, data, None, txn, "overwrite")

    def _merge(self, root: str, source: DataFrame, on: MergeOn, txn: Txn) -> CommitOutcome:
        """The source travels to the driver as Arrow, so this is meant for master-data
        maintenance batches, not for bulk loads (use ``append`` for those). delta-rs writes
        and commits a merge in one call, so the commit guard runs just before that call.
        """
        keys, delete_flag = on.keys, on.delete_flag
        table = self._tips.open(root)
        schema = arrow_to_spark(table.schema().to_arrow())
        require_merge_source(root, schema, source, keys, delete_flag)
        commit_id = self._new_commit_id()
        skipped = skip_if_committed(root, table, txn)
        if skipped:
            return skipped
        base_version = table.version()
        columns = schema.fieldNames()
        arrow = source.select(*columns, *([delete_flag] if delete_flag else [])).toArrow()
        values = {c: f"s.`{c}`" for c in columns}
        committer = self._committer()
        builder = table.merge(
            arrow,
            predicate=" AND ".join(f"t.`{k}` = s.`{k}`" for k in keys),
            source_alias="s",
            target_alias="t",
            commit_properties=committer.commit_properties(txn, commit_id, self._max_commit_retries),
        )
        if delete_flag:
            keep = f"NOT s.`{delete_flag}`"
            builder = builder.when_matched_delete(predicate=f"s.`{delete_flag}`")
            builder = builder.when_matched_update(values, predicate=keep)
            builder = builder.when_not_matched_insert(values, predicate=keep)
        else:
            builder = builder.when_matched_update(values).when_not_matched_insert(values)
        self._check_commit_guard()
        try:
            with optional_phase(self.clock, "commit"):  # delta-rs merges and commits in one
                metrics = builder.execute()
        except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
            return committer.recover_or_raise(
                root, base_version, commit_id, txn, e, NOTHING_WRITTEN, "merge"
            )
        logger.info("merged into %s: %s", root, metrics)
        return committer.landed(root, base_version, commit_id, NOTHING_WRITTEN)

    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]:
        """Delete unreferenced files older than the retention, except those of kept versions.

        ``full`` mode also removes untracked Parquet left by killed writers. Keep the
        retention longer than the longest write, so an in-flight write is never cleaned.
        """
        table = self._tips.open(path)
        deleted = table.vacuum(
            retention_hours=int(retention_hours),
            dry_run=False,
            enforce_retention_duration=False,
            full=True,
            keep_versions=sorted(set(keep_versions)) or None,
        )
        logger.info("vacuumed %s: %d file(s) deleted", path, len(deleted))
        return list(deleted)

    def _bin_pack(self, root: str, target_file_bytes: int) -> tuple[int, Mapping[str, Any]]:
        """delta-rs ``optimize.compact``, on the handle whose version it reports."""
        table = self._tips.open(root)
        before = table.version()
        self._check_commit_guard()
        metrics = table.optimize.compact(
            target_size=target_file_bytes,
            max_concurrent_tasks=1,  # the driver's side; Spark's executors are not involved
            commit_properties=CommitProperties(
                custom_metadata=tagged_metadata(self.commit_metadata, self._new_commit_id()),
                max_commit_retries=self._max_commit_retries,
            ),
        )
        return before, metrics
