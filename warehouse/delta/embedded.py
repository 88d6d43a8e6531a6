"""The embedded Delta engine: Spark writes and reads Parquet, delta-rs owns the log.

Write path (append, replace, overwrite, delete_partitions, merge):

1. Refuse the write unless the data has the table's schema (delta-rs does not check it).
2. Skip it if the table already records the app transaction (delta-rs records app ids but
   does not deduplicate them).
3. Spark executors write Parquet into a fresh, uniquely named directory under the table root.
   Nothing reads those files until the log references them: a crash here leaves untracked
   files that ``vacuum`` removes, never visible rows.
4. The optional ``commit_guard`` runs (it raises, e.g., when this process lost the pipeline
   lease; nothing is committed then). delta-rs writes and commits a merge in one call, so
   for merge the guard runs just before that call.
5. The driver commits. Appends and partition overwrites of a local table whose protocol
   asks a writer to honour nothing beyond writer version 2 are committed by writing the
   commit file itself (``log_writer``: the next version after the table's tip, created
   only if absent; a checkpoint every ``delta.checkpointInterval`` versions), which costs a
   fraction of delta-rs's commit and leaves the engine knowing the new version without
   reading it back. Everything else, and a commit whose version another writer took, goes
   through ``DeltaTable.create_write_transaction`` against the tip's version, whose
   conflict checks then apply. Every commit carries a fresh id in its commitInfo
   (``enrichment.commitId``, plus ``commit_metadata``), and the engine reports as its own
   only the commit carrying that id: the version in the outcome is that commit's. If the
   delta-rs call raises, the log is re-read: an error that surfaced after the commit
   landed (e.g. from a post-commit hook) is recognised by the id and not retried; when the
   app transaction was recorded by another writer's commit (two processes racing on one
   step), the outcome is ``committed=False`` and this write's files stay untracked.

Replace, overwrite and delete_partitions are optimistic: they remember the files in scope
(the selected partitions, or the whole table) at the version they opened, and commit only
if every later commit left exactly those files, schema and partitioning alone; the removes
are then taken at the newest version. Otherwise they raise
:class:`~common.errors.ConcurrentModificationError` and commit nothing, so a retry is clean.
A concurrent append into another partition does not conflict.

Read path: the pinned snapshot's Add actions give the file list and typed partition values;
Spark reads exactly those files, and partition values are attached by file location.

A table's latest version is its tip (``_Tip``): the schema, partitioning, properties,
protocol and app transactions a write checks, kept while no later commit file exists and
brought forward over other writers' commit files; a delta-rs handle is opened once and
moved only when a delta-rs operation needs it.

Log reads a process repeats are kept per version (``version_cache``: a version never
changes while its commit file is the same file): snapshots, and commit files parsed once
(``commit_file``: rows added, data-change flags, commitInfo). A version after one already
listed is replayed from it and the commit files in between (``log_replay``), not opened
and listed again: following a stream table takes a small read per new commit. Whatever
the replay does not model (a schema or protocol change, a timestamp partition, a commit
file log retention removed) is listed by delta-rs as before.
"""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from datetime import datetime
from typing import Any, Literal
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError as DeltaRsTableNotFound
from deltalake.transaction import AddAction, CommitProperties, Transaction
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
)

from common.arrow_rows import rows_at
from common.errors import (
    CommitError,
    ConcurrentModificationError,
    DeltaTableError,
    TableNotFoundError,
    UnsupportedOperationError,
)
from common.faults import crash_point
from common.phase_clock import optional_phase
from warehouse.delta.added_files import FileAction
from warehouse.delta.added_rows import require_version_range
from warehouse.delta.api import (
    CHECKPOINT_INTERVAL_PROPERTY,
    COMMIT_VERSION,
    AppTransaction,
    CommitOutcome,
    DataFile,
    PartitionFilter,
    Snapshot,
    describe_filters,
    history_in_range,
    total_records,
)
from warehouse.delta.commit_file import CommitFile
from warehouse.delta.commit_protocol import (
    COMMIT_ID_KEY,
    already_recorded,
    outcome_after_error,
    tagged_metadata,
)
from warehouse.delta.engine_base import EngineBase, FileActions, RangeEnd
from warehouse.delta.features import require_readable
from warehouse.delta.file_stats import column_bounds, delta_stats_json
from warehouse.delta.log_replay import replay_actions
from warehouse.delta.log_writer import (
    LogFile,
    add_action,
    commit_info_action,
    remove_action,
    sync_files,
    txn_action,
    writable,
    write_commit,
)
from warehouse.delta.partition_paths import (
    HIVE_NULL,
    delta_partition_literal,
    normalised_location,
    partition_values_from_path,
    uri_suffix_keys,
)
from warehouse.delta.schema import (
    arrow_to_spark,
    require_merge_source,
    require_same_schema,
    spark_to_arrow,
)
from warehouse.delta.table_paths import commit_file_location, data_file_location, table_root
from warehouse.delta.version_cache import VersionCache
from warehouse.object_store import filesystem_of, is_object_store, object_stamp, storage_options

logger = logging.getLogger(__name__)
# Rows per Parquet file an Arrow write makes at most: a large write becomes several files,
# written side by side (one 800k-row file took one core 0.3 s; Spark writes a file a task).
_FILE_ROWS = 262_144
# Pieces are written side by side only when together they hold this many rows. Smaller
# writes (an operator step's state segments) run in the calling thread: in a fresh or a
# pooled writer thread, a 48k-row segment sometimes took 12-17 ms of that thread's CPU
# time where the calling thread wrote it in 2-3 ms every time (measured over 10 steps).
# Once the SSBJ encoder stopped making a zeroed null array per column, the pool no longer
# showed it (2.0-2.7 ms with mimalloc, the system allocator and jemalloc alike); a small
# write gains nothing from a second thread either way.
_PARALLEL_WRITE_ROWS = 2 * _FILE_ROWS

_FILE_KEY = "__source_file"
# Snapshots an engine keeps by version (see EmbeddedDeltaEngine._snapshots).
_SNAPSHOTS_KEPT = 256
# The most commits a snapshot is replayed over from an earlier one (beyond, it is listed).
_REPLAYED_COMMITS = 64
# Parsed commit files an engine keeps (a few KB each).
_COMMITS_KEPT = 4096
# delta-rs's default checkpoint interval (commits between checkpoints; delta-spark's is 10).
_CHECKPOINT_INTERVAL = 100
# Partition column types whose values a remove can name exactly as the log wrote them.
_REMOVABLE_PARTITION_TYPES = (ByteType, ShortType, IntegerType, LongType, StringType)
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


@dataclass(frozen=True)
class ReadCaches:
    """What embedded engines have read, by table version: every entry is checked against
    the table's commit files when served (:mod:`warehouse.delta.version_cache`), so the
    engines of one process may share them; a warm worker's commands then open each table
    once, not once a command."""

    snapshots: VersionCache[Snapshot] = dataclass_field(
        default_factory=lambda: VersionCache(_SNAPSHOTS_KEPT)
    )
    tips: VersionCache[_Tip] = dataclass_field(
        default_factory=lambda: VersionCache(_SNAPSHOTS_KEPT)
    )
    commits: VersionCache[CommitFile] = dataclass_field(
        default_factory=lambda: VersionCache(_COMMITS_KEPT)
    )


class EmbeddedDeltaEngine(EngineBase[DataFile]):
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
        commit_guard: Callable[[], None] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
        table_properties: Mapping[str, str] | None = None,
        write_log: bool = True,
        caches: ReadCaches | None = None,
    ) -> None:
        super().__init__(
            session,
            commit_guard=commit_guard,
            commit_metadata=commit_metadata,
            table_properties=table_properties,
        )
        self._max_commit_retries = max_commit_retries
        caches = ReadCaches() if caches is None else caches
        # Snapshots by (root, version): a version of a table never changes, so the log is
        # read and decoded once per version (an SSBJ step asks for the same pinned versions
        # several times); see warehouse.delta.version_cache.
        self._snapshots = caches.snapshots
        # The latest version of each table as this engine knows it (``_Tip``), served while
        # no newer commit file exists: opening a table replays its log from the last
        # checkpoint (about 10-20 ms locally; on an object store a listing and a GET of every
        # commit since the checkpoint), several times a step. The engine's own commit makes
        # the next tip; another writer's commits bring it forward from their commit files.
        self._tips = caches.tips
        # Commit this engine's appends and partition overwrites by writing their commit
        # files (``log_writer``) where the table's protocol allows it; delta-rs otherwise.
        self._write_log = write_log
        # Commit files by (root, version), parsed once: admission reads the row counts of
        # the next 256 input versions every step, and a range's reads ask each version's
        # actions, data-change flags and commitInfo again.
        self._commits = caches.commits

    # ------------------------------------------------------------------ table handles

    def _open(self, path: str, version: int | None = None, held: bool = True) -> DeltaTable:
        """A delta-rs handle on ``path`` at ``version`` (the latest by default). The latest
        is the held handle of the table's tip (:meth:`_tip`), moved to the tip's version
        when it is behind (this engine's own commits do not move it); ``held=False`` opens a
        handle of the caller's own (one it may keep while the table moves on)."""
        root = table_root(path)
        if version is None and held:
            moved = self._tip_handle(root, self._tip(root))
            return moved if moved is not None else self._held_tip(root).handle
        return self._open_table(root, version)

    def _open_table(self, root: str, version: int | None = None) -> DeltaTable:
        """A fresh delta-rs handle, refused when the table needs a reader feature this
        engine cannot honour."""
        try:
            table = DeltaTable(root, version=version, storage_options=storage_options(root))
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

    def _tip(self, root: str) -> _Tip:
        """The table's latest version as this engine knows it (:class:`_Tip`): the one it
        holds while no later commit file exists; else that one brought forward over the
        commits since (another writer's appends: a small read each); else a fresh open."""
        known = self._tips.latest(root)
        if known is not None:
            return known
        older = self._tips.latest_before(root, sys.maxsize)
        if older is not None:
            advanced = self._advanced(root, older[1])
            if advanced is not None:
                return advanced
        return self._held_tip(root)

    def _held_tip(self, root: str) -> _Tip:
        """The tip of a fresh open of the latest version, held from now on."""
        tip = _Tip.of(root, self._open_table(root))
        self._hold_tip(tip)
        return tip

    def _hold_tip(self, tip: _Tip) -> None:
        self._tips.drop_table(tip.root)  # only the newest tip is ever served
        self._tips.put(tip.root, tip.table_version, tip)

    def _advanced(self, root: str, tip: _Tip) -> _Tip | None:
        """``tip`` brought to the latest version over the commit files after it, or None
        where a commit may change what a tip holds (a metaData or protocol action), a
        commit file is gone or unreadable, or the held handle would fall more than
        :data:`_REPLAYED_COMMITS` behind."""
        txns = dict(tip.txns)
        version = tip.table_version
        while _commit_exists(root, version + 1):
            if version + 1 - tip.handle.version() > _REPLAYED_COMMITS:
                return None
            try:
                commit = self._commit(root, version + 1)
            except (OSError, ValueError):
                return None
            for action in commit.actions:
                if "metaData" in action or "protocol" in action:
                    return None
                body = action.get("txn")
                if isinstance(body, Mapping):
                    txns[str(body["appId"])] = int(body["version"])
            version += 1
        advanced = replace(tip, table_version=version, txns=txns)
        self._hold_tip(advanced)
        return advanced

    def _tip_handle(self, root: str, tip: _Tip) -> DeltaTable | None:
        """The tip's own delta-rs handle at the tip's version: moved there when it is
        behind by at most :data:`_REPLAYED_COMMITS` and the tip is still the one held (a
        handle is moved only forward, over commits :meth:`_advanced` accepted); None when
        it cannot be."""
        handle = tip.handle
        behind = tip.table_version - handle.version()
        if 0 < behind <= _REPLAYED_COMMITS and self._tips.get(root, tip.table_version) is tip:
            try:
                handle.load_as_version(tip.table_version)
            except Exception as e:  # noqa: BLE001 - delta-rs raises several types
                logger.debug("%s: cannot move the held handle: %s", root, e)
        return handle if handle.version() == tip.table_version else None

    def _handle_at(self, root: str, tip: _Tip) -> DeltaTable:
        """A delta-rs handle at exactly the tip's version, for a commit through delta-rs
        made against it: the tip's own, else one opened at that version."""
        moved = self._tip_handle(root, tip)
        return moved if moved is not None else self._open_table(root, tip.table_version)

    def exists(self, path: str) -> bool:
        """A table of which this engine holds a version whose commit file is still that
        file exists (a stat); otherwise delta-rs looks (2 ms, several times a step)."""
        root = table_root(path)
        return (
            self._snapshots.holds(root)
            or self._tips.holds(root)
            or DeltaTable.is_deltatable(root, storage_options=storage_options(root))
        )

    def _definition(self, root: str) -> Snapshot:
        """The latest version's schema, partitioning and properties, without listing its
        files (a table a step appends to is checked every step)."""
        tip = self._tip(root)
        known = self._snapshots.get(root, tip.table_version)
        if known is not None:
            return known
        return Snapshot(
            table_path=root,
            version=tip.table_version,
            schema=tip.schema,
            partition_columns=tip.partition_columns,
            files=(),
            properties=dict(tip.properties),
        )

    def _create(
        self,
        root: str,
        schema: StructType,
        partition_by: Sequence[str],
        configuration: Mapping[str, str],
    ) -> bool:
        DeltaTable.create(
            root,
            spark_to_arrow(schema),
            partition_by=list(partition_by) or None,
            configuration=dict(configuration),
            storage_options=storage_options(root),
        )
        return True

    def _latest_version(self, root: str) -> int:
        return self._tip(root).table_version

    # ------------------------------------------------------------------ reads

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        root = table_root(path)
        if timestamp is None:
            if version is None:
                version = self._tip(root).table_version
            known = self._snapshots.get(root, version)
            if known is not None:
                return known
            replayed = self._replayed(root, version)
            if replayed is not None:
                return replayed
            tip = self._tips.get(root, version)
            if tip is not None and tip.handle.version() == version:
                table = tip.handle  # the held handle is at this version: no open
            else:
                table = self._open(root, version)
        else:
            table = self._open(root, held=False)
            table.load_as_version(timestamp)
            known = self._snapshots.get(root, table.version()) or self._replayed(
                root, table.version()
            )
            if known is not None:  # already listed, or replayed from a listed version
                return known
        snapshot = self._snapshot_of(root, table)
        self._snapshots.put(root, snapshot.version, snapshot)
        return snapshot

    def _replayed(self, root: str, version: int) -> Snapshot | None:
        """``version`` from the newest earlier version this engine holds and the commit
        files in between (``log_replay``), each version on the way kept as well; None where
        that does not apply: no earlier version within :data:`_REPLAYED_COMMITS`, a commit
        file gone (log retention), or an action the replay does not model (a schema or
        protocol change, say). A commit file is a small read; opening the version in
        delta-rs and listing its files cost 12 ms and more per version on a log of 1,400
        files (an SSBJ step's input spans 6-7 bronze versions)."""
        base = self._snapshots.latest_before(root, version)
        if base is None or version - base[0] > _REPLAYED_COMMITS:
            return None
        base_version, snapshot = base
        for between in range(base_version + 1, version + 1):
            try:
                commit = self._commit(root, between)
            except (OSError, ValueError):
                return None
            files = replay_actions(
                root,
                {f.path: f for f in snapshot.files},
                [commit.actions],
                snapshot.schema,
                snapshot.partition_columns,
                {},  # no column mapping: require_readable refuses it
                by_location=True,
            )
            if files is None:
                return None
            snapshot = replace(snapshot, version=between, files=tuple(files.values()))
            self._snapshots.put(root, between, snapshot)
        return snapshot

    def _snapshot_of(self, root: str, table: DeltaTable, with_files: bool = True) -> Snapshot:
        """``table``'s version as a Snapshot; without ``with_files``, its definition only
        (schema, partitioning, properties: no file listing)."""
        metadata = table.metadata()
        partitions = tuple(metadata.partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist() if with_files else []
        schema = arrow_to_spark(table.schema().to_arrow())
        files = tuple(
            DataFile(
                path=data_file_location(root, action["path"]),
                size_bytes=int(action["size_bytes"]),
                num_records=action.get("num_records"),
                partition_values={c: action.get(f"partition.{c}") for c in partitions},
                bounds=column_bounds(
                    schema,
                    {c: action.get(f"min.{c}") for c in schema.fieldNames()},
                    {c: action.get(f"max.{c}") for c in schema.fieldNames()},
                ),
                log_path=action["path"],  # delta-rs lists the log's path text
            )
            for action in actions
        )
        return Snapshot(
            table_path=root,
            version=table.version(),
            schema=schema,
            partition_columns=partitions,
            files=files,
            properties={k: v for k, v in metadata.configuration.items() if v is not None},
        )

    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        """The rows of ``files`` (all of the snapshot's by default) with the snapshot's schema.

        Partition values come from the log, not the paths. Files of one partition (a scan
        partition of SSBJ's copy, an interval of an output) are read with its values as
        literals: no Spark job beyond the scan. Files of more partitions are joined to a
        broadcast lookup of their values by file, so the plan stays one scan however many
        partitions are read (a scan per partition, with literals, was tried: about 0.25 s
        of planning each, more than the broadcast job it saves, measured on the audit's
        read of the published table). The lookup's key is the shortest tail of the file's
        URI that tells the files apart (``partition_paths.uri_suffix_keys``), so a row pays
        a substring, not a decoding of its file's path: a count of 2.2M rows of an SSBJ
        output over 7 intervals took 7.4 s with the decoding and 1.0 s with the tail."""
        chosen = snapshot.files if files is None else tuple(files)
        columns = snapshot.schema.fieldNames()
        if not chosen:
            return self._spark.createDataFrame([], snapshot.schema)
        partitions = snapshot.partition_columns
        data_schema = StructType([f for f in snapshot.schema.fields if f.name not in partitions])
        frame = self._spark.read.schema(data_schema).parquet(*[f.path for f in chosen])
        if not partitions:
            return frame.select(*columns)
        distinct = {tuple(f.partition_values.get(c) for c in partitions) for f in chosen}
        if len(distinct) == 1:
            (values,) = distinct
            literals = [
                F.lit(value).cast(snapshot.schema[c].dataType).alias(c)
                for c, value in zip(partitions, values, strict=True)
            ]
            return frame.select(*[F.col(f.name) for f in data_schema.fields], *literals).select(
                *columns
            )
        lookup_schema = StructType(
            [StructField(_FILE_KEY, StringType(), False)] + [snapshot.schema[c] for c in partitions]
        )
        suffixes = uri_suffix_keys(frame.inputFiles(), [f.path for f in chosen])
        if suffixes is not None:
            # A row's key is the tail of its file's URI as Spark writes it: no per-row
            # decoding (url_decode and a regex over 2.2M rows made a count 8x slower).
            depth, keys = suffixes
            row_key = F.substring_index(F.col("_metadata.file_path"), "/", -depth)
        else:
            keys = [normalised_location(f.path) for f in chosen]
            row_key = _decoded_file_location()
        lookup = self._spark.createDataFrame(
            [
                (key, *[f.partition_values.get(c) for c in partitions])
                for key, f in zip(keys, chosen, strict=True)
            ],
            lookup_schema,
        )
        return (
            frame.withColumn(_FILE_KEY, row_key)
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
        return self._tip(table_root(path)).transaction_version(app_id)

    def _range_end(self, root: str, version: int) -> RangeEnd[DataFile]:
        end = self.snapshot(root, version)
        return RangeEnd(end, lambda files: self.read_files(end, files))

    def _change_feed(
        self, root: str, after_version: int, to_version: int, schema: StructType
    ) -> DataFrame:
        """delta-rs's ``load_cdf``, in the driver's memory, handed to Spark."""
        table = self._open(root, to_version)
        feed = pa.RecordBatchReader.from_stream(
            table.load_cdf(starting_version=after_version + 1, ending_version=to_version)
        ).read_all()
        # delta-rs answers with view and unsigned types that Spark cannot convert.
        target = spark_to_arrow(schema)
        return self._spark.createDataFrame(feed.select(target.names).cast(target), schema)

    def count_rows_added(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
    ) -> int | None:
        """The rows :meth:`rows_added` reads, from the files' ``numRecords`` (the embedded
        engine refuses deletion vectors, so a live file's rows are all its records)."""
        _, by_version = self._added_by_version(path, after_version, to_version, skip_versions)
        return total_records(f for files in by_version.values() for f in files)

    def rows_by_version(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, int]]:
        """From each version's commit file: one small read per version, where replaying
        snapshots would cost a file listing each. A commit file already cleaned up by log
        retention falls back to the snapshots."""
        root = table_root(path)
        versions = range(after_version + 1, to_version + 1)
        try:
            return [
                (version, (known or self._commit(root, version)).rows_added)
                for version, known in zip(
                    versions, self._commits.get_many(root, versions), strict=True
                )
            ]
        except FileNotFoundError:
            return [
                (
                    version,
                    sum(a.payload.num_records or 0 for a in adds if a.data_change and a.payload),
                )
                for version, adds, _ in self._file_actions(root, after_version, to_version)
            ]

    def commit_infos(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, Mapping[str, Any]]]:
        """From each version's commit file (parsed once per version); a commit file log
        retention removed falls back to the history."""
        root = table_root(path)
        try:
            return [
                (version, self._commit(root, version).info)
                for version in range(after_version + 1, to_version + 1)
            ]
        except FileNotFoundError:
            return history_in_range(self, root, after_version, to_version)

    def _commit(self, root: str, version: int) -> CommitFile:
        """``version``'s commit file, parsed; OSError when it is not there, ValueError
        when a line is not JSON."""
        known = self._commits.get(root, version)
        if known is not None:
            return known
        commit = CommitFile.parse(version, self._commit_text(root, version))
        self._commits.put(root, version, commit)
        return commit

    @staticmethod
    def _commit_text(root: str, version: int) -> str:
        filesystem, base = _filesystem_of(commit_file_location(root, version))
        with filesystem.open_input_stream(base) as handle:
            return str(handle.read().decode("utf-8"))

    def _file_actions(
        self, root: str, after_version: int, to_version: int
    ) -> FileActions[DataFile]:
        """(version, adds, removes) of each version in (after, to].

        The files come from consecutive snapshots (typed partition values, as reads need
        them; each replayed from the one before where :meth:`_replayed` applies); which of
        their adds and removes change data comes from the version's commit file. A commit
        file already cleaned up by log retention counts every action as a data change, as
        the snapshots alone would say.
        """
        require_version_range(f"changes of {root}", after_version, to_version)
        previous = {f.path: f for f in self.snapshot(root, after_version).files}
        for version in range(after_version + 1, to_version + 1):
            current = {f.path: f for f in self.snapshot(root, version).files}
            quiet = self._no_data_change(root, version)
            adds = [
                FileAction(p, _partition_key(f), p not in quiet, f)
                for p, f in current.items()
                if p not in previous
            ]
            removes = [
                FileAction(p, _partition_key(f), p not in quiet, f)
                for p, f in previous.items()
                if p not in current
            ]
            yield version, adds, removes
            previous = current

    def _no_data_change(self, root: str, version: int) -> frozenset[str]:
        """The file locations one commit adds or removes with ``dataChange=false``."""
        try:
            quiet = self._commit(root, version).quiet_paths
        except FileNotFoundError:
            logger.warning(
                "%s: the commit file of version %d is gone (log retention); its adds and "
                "removes are taken as data changes",
                root,
                version,
            )
            return frozenset()
        return frozenset(data_file_location(root, path) for path in quiet)

    # ------------------------------------------------------------------ writes

    def _append(self, path: str, data: DataFrame, txn: AppTransaction | None) -> CommitOutcome:
        return self._write(path, data, None, txn)

    def rows_added_arrow(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
        with_version: bool = False,
    ) -> pa.Table:
        """Reads the added files with pyarrow in the driver: no Spark job. Partition values
        come from the log, as :meth:`read_files` attaches them."""
        end, by_version = self._added_by_version(path, after_version, to_version, skip_versions)
        if not with_version:
            return _arrow_of_files(
                end.snapshot, [f for files in by_version.values() for f in files]
            )
        schema = spark_to_arrow(end.snapshot.schema).append(pa.field(COMMIT_VERSION, pa.int64()))
        parts = []
        for version, files in by_version.items():
            rows = _arrow_of_files(end.snapshot, files)
            parts.append(
                rows.append_column(
                    COMMIT_VERSION, pa.repeat(pa.scalar(version, pa.int64()), len(rows))
                )
            )
        return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()

    def read_arrow(
        self,
        snapshot: Snapshot,
        files: Sequence[DataFile] | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """Reads the files with pyarrow in the driver (only ``columns``, each file filtered
        by ``where`` as it is read): no Spark job."""
        return _arrow_of_files(snapshot, snapshot.files if files is None else files, columns, where)

    def append_rows(
        self,
        path: str,
        rows: Sequence[tuple[Any, ...]],
        schema: StructType,
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Writes one Parquet file with pyarrow on the driver: no Spark job for a few rows.
        A partitioned table takes the ordinary (Spark) append."""
        root = table_root(path)
        tip = self._tip(root)
        if tip.partition_columns:
            return super().append_rows(root, rows, schema, txn)
        existing = tip.schema
        require_same_schema(root, existing, schema)
        commit_id = self._new_commit_id()
        skipped = self._skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        arrow_schema = spark_to_arrow(existing)
        data = pa.Table.from_pylist(
            [dict(zip(schema.fieldNames(), row, strict=True)) for row in rows], arrow_schema
        )
        relative = f"{uuid.uuid4().hex[:20]}/part-00000-{uuid.uuid4()}.parquet"
        location = f"{root.rstrip('/')}/{relative}"
        filesystem, located = _filesystem_of(location)
        with optional_phase(self.clock, "write"):
            filesystem.create_dir(os.path.dirname(located), recursive=True)
            with filesystem.open_output_stream(located) as handle:
                footer = _write_parquet(data, handle)
            size = int(filesystem.get_file_info(located).size or 0)
            now_ms = int(datetime.now().timestamp() * 1000)
            written = _durable(
                root,
                _Written.of([_added_file(filesystem, located, relative, size, {}, now_ms, footer)]),
            )
        return self._commit_append(root, tip, written, existing, [], txn, commit_id)

    def append_rows_added(
        self,
        source: str,
        after_version: int,
        to_version: int,
        target: str,
        txn: AppTransaction | None = None,
        skip_versions: Sequence[int] = (),
        partition_by: Sequence[str] | None = None,
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
        added, by_version = self._added_by_version(source, after_version, to_version, skip_versions)
        end = added.snapshot
        if partition_by is not None:
            self.create_table(target, end.schema, partition_by)
        root = table_root(target)
        tip = self._tip(root)
        schema = tip.schema
        require_same_schema(root, schema, end.schema)
        files = [f for files in by_version.values() for f in files]
        partitions = list(tip.partition_columns)
        if partitions != list(end.partition_columns):
            return self._write(root, self.read_files(end, files), None, txn)
        commit_id = self._new_commit_id()
        skipped = self._skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        with optional_phase(self.clock, "write"):
            written = self._link_files(end.table_path, files, root, partitions)
        return self._commit_append(root, tip, written, schema, partitions, txn, commit_id)

    @staticmethod
    def _link_files(
        source_root: str, files: Sequence[DataFile], root: str, partitions: list[str]
    ) -> _Written:
        """Give ``files`` names under a fresh directory of ``root``, keeping their partition
        directories; the Add actions that reference them."""
        prefix = uuid.uuid4().hex[:20]
        now_ms = int(datetime.now().timestamp() * 1000)
        added = []
        for file in files:
            relative = os.path.relpath(file.path, source_root)
            if relative.startswith(".."):  # a file the log names by an absolute location
                relative = os.path.basename(file.path)
            destination = f"{root.rstrip('/')}/{prefix}/{relative}"
            _link_or_copy(file.path, destination)
            filesystem, located = _filesystem_of(destination)
            values = {c: delta_partition_literal(file.partition_values.get(c)) for c in partitions}
            added.append(
                _added_file(
                    filesystem, located, f"{prefix}/{relative}", file.size_bytes, values, now_ms
                )
            )
        logger.debug("linked %d file(s) of %s under %s/%s", len(added), source_root, root, prefix)
        return _durable(root, _Written.of(added))

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
        tip = self._tip(root)
        schema = tip.schema
        data_schema = arrow_to_spark(data.schema) if isinstance(data, pa.Table) else data.schema
        require_same_schema(root, schema, data_schema)
        commit_id = self._new_commit_id()
        skipped = self._skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        partitions = list(tip.partition_columns)
        if where is not None:
            _check_partition_predicate(root, partitions, where, operation)
        if operation == "append":
            written = self._write_data(root, data, schema, partitions)
            return self._commit_append(root, tip, written, schema, partitions, txn, commit_id)
        # The files the replace removes, as of the version it was asked against: taken before
        # the Parquet write, so a concurrent change during the write is caught at commit.
        scope = self._own_scope(root, tip, where)
        written = self._write_data(root, data, schema, partitions)
        if scope is not None:
            own = self._commit_own(root, tip, written, scope, txn, commit_id)
            if own is not None:
                return own
        # delta-rs commits it (or, having lost the version, checks what changed since the
        # tip and commits on the new version): from the files in scope at the tip.
        table = self._handle_at(root, tip)
        filters = _delta_filters(where) if where else None
        return self._commit_replacing(
            root,
            table,
            self._files_in_scope(root, table, filters),
            written,
            schema=schema,
            partitions=partitions,
            filters=filters,
            txn=txn,
            commit_id=commit_id,
            operation=operation,
            scope=describe_filters(where) if where else "the whole table",
        )

    def replace(
        self,
        path: str,
        data: DataFrame,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Atomically replace the rows of the partitions selected by ``where`` with ``data``.

        Raises :class:`ConcurrentModificationError`, committing nothing, when another writer
        added or removed files in those partitions after this call opened the table.
        """
        root = table_root(path)
        self._require_partition_predicate(root, where, "replace")
        outside = data.filter(~F.coalesce(_spark_condition(where), F.lit(False))).limit(1)
        if outside.count():
            raise _rows_outside(root, where)
        return self._write(path, data, where, txn, "replace")

    def _require_partition_predicate(
        self, root: str, where: Sequence[PartitionFilter], operation: str
    ) -> list[str]:
        partitions = list(self._tip(root).partition_columns)
        _check_partition_predicate(root, partitions, where, operation)
        return partitions

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        root = table_root(path)
        partitions = self._require_partition_predicate(root, where, "delete_partitions")
        tip = self._tip(root)
        commit_id = self._new_commit_id()
        skipped = self._skip_if_committed(root, tip, txn)
        if skipped:
            return skipped
        scope = self._own_scope(root, tip, where)
        if scope is not None:
            own = self._commit_own(root, tip, _Written((), 0), scope, txn, commit_id)
            if own is not None:
                return own
        table = self._handle_at(root, tip)
        filters = _delta_filters(where)
        return self._commit_replacing(
            root,
            table,
            self._files_in_scope(root, table, filters),
            _Written((), 0),
            schema=arrow_to_spark(table.schema().to_arrow()),
            partitions=partitions,
            filters=filters,
            txn=txn,
            commit_id=commit_id,
            operation="delete_partitions",
            scope=describe_filters(where),
        )

    def overwrite(
        self, path: str, data: DataFrame, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """Replace every row; conflicts with any file change after the table was opened."""
        return self._write(path, data, None, txn, "overwrite")

    def append_arrow(
        self,
        path: str,
        data: pa.Table,
        txn: AppTransaction | None = None,
        partition_by: Sequence[str] | None = None,
    ) -> CommitOutcome:
        """Writes the rows with pyarrow on the driver (a file per partition): no Spark job."""
        if partition_by is not None:
            self.create_table(path, arrow_to_spark(data.schema), partition_by)
        return self._write(path, data, None, txn)

    def overwrite_arrow(
        self, path: str, data: pa.Table, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """:meth:`overwrite` of Arrow rows, written with pyarrow on the driver."""
        return self._write(path, data, None, txn, "overwrite")

    def replace_arrow(
        self,
        path: str,
        data: pa.Table,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """:meth:`replace` of Arrow rows, written with pyarrow on the driver (no Spark job)."""
        # The predicate's columns (and that there is one) are checked against the table's
        # partitions on the handle ``_write`` opens.
        if where and data.num_rows and not pc.all(_arrow_condition(where, data)).as_py():
            raise _rows_outside(table_root(path), where)
        return self._write(path, data, where, txn, "replace")

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
        maintenance batches, not for bulk loads (use ``append`` for those). delta-rs writes
        and commits a merge in one call, so the commit guard runs just before that call.
        """
        root = table_root(path)
        table = self._open(root)
        schema = arrow_to_spark(table.schema().to_arrow())
        require_merge_source(root, schema, source, keys, delete_flag)
        commit_id = self._new_commit_id()
        skipped = self._skip_if_committed(root, table, txn)
        if skipped:
            return skipped
        base_version = table.version()
        columns = schema.fieldNames()
        arrow = source.select(*columns, *([delete_flag] if delete_flag else [])).toArrow()
        values = {c: f"s.`{c}`" for c in columns}
        builder = table.merge(
            arrow,
            predicate=" AND ".join(f"t.`{k}` = s.`{k}`" for k in keys),
            source_alias="s",
            target_alias="t",
            commit_properties=self._commit_properties(txn, commit_id, self._max_commit_retries),
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
            return self._recover_or_raise(
                root, base_version, commit_id, txn, e, _Written((), 0), "merge"
            )
        logger.info("merged into %s: %s", root, metrics)
        return self._landed(root, base_version, commit_id, _Written((), 0))

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

    def _bin_pack(self, root: str, target_file_bytes: int) -> tuple[int, Mapping[str, Any]]:
        """delta-rs ``optimize.compact``, on the handle whose version it reports."""
        table = self._open(root)
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

    # ------------------------------------------------------------------ commit helpers

    def _skip_if_committed(
        self, root: str, table: DeltaTable | _Tip, txn: AppTransaction | None
    ) -> CommitOutcome | None:
        if txn is None:
            return None
        recorded = table.transaction_version(txn.app_id)
        if already_recorded(txn, recorded):
            logger.info(
                "skip commit to %s: app %s already at version %s (asked %s)",
                root,
                txn.app_id,
                recorded,
                txn.version,
            )
            return CommitOutcome(table_version=table.version(), committed=False)
        return None

    def _commit_properties(
        self, txn: AppTransaction | None, commit_id: str, max_commit_retries: int
    ) -> CommitProperties:
        return CommitProperties(
            custom_metadata=tagged_metadata(self.commit_metadata, commit_id),
            max_commit_retries=max_commit_retries,
            app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None,
        )

    def _write_transaction(
        self,
        table: DeltaTable,
        written: _Written,
        schema: StructType,
        partitions: list[str],
        properties: CommitProperties,
        mode: Literal["append", "overwrite"] = "append",
        filters: list[tuple[str, str, Any]] | None = None,
    ) -> None:
        """Commit ``written``'s files with delta-rs (an overwrite replaces what ``filters``
        select, or the whole table without them); its time is the ``commit`` phase."""
        with optional_phase(self.clock, "commit"):
            table.create_write_transaction(
                list(written.adds),
                mode=mode,
                schema=spark_to_arrow(schema),
                partition_by=partitions or None,
                partition_filters=filters,
                commit_properties=properties,
            )

    def _write_data(
        self, root: str, data: DataFrame | pa.Table, schema: StructType, partitions: list[str]
    ) -> _Written:
        if isinstance(data, pa.Table):
            arrow = data.select(schema.fieldNames()).cast(spark_to_arrow(schema))
            return self._write_arrow_files(root, arrow, partitions)
        return self._write_files(root, data.select(*schema.fieldNames()), partitions)

    def _write_arrow_files(self, root: str, data: pa.Table, partitions: list[str]) -> _Written:
        """One Parquet file per partition of ``data``, under a fresh folder of the table in
        ``col=value`` directories (values percent-escaped; the log, not the path, holds the
        partition values), each with its Add action."""
        prefix = uuid.uuid4().hex[:20]
        filesystem, base = _filesystem_of(f"{root.rstrip('/')}/{prefix}")
        now_ms = int(datetime.now().timestamp() * 1000)

        def write(values: dict[str, Any], rows: pa.Table) -> tuple[AddAction, int]:
            literal = {c: delta_partition_literal(v) for c, v in values.items()}
            directory = "/".join(
                f"{quote(c, safe='')}={HIVE_NULL if v is None else quote(v, safe='')}"
                for c, v in literal.items()
            )
            name = f"part-{uuid.uuid4()}.parquet"
            relative = f"{directory}/{name}" if directory else name
            located = f"{base}/{relative}"
            filesystem.create_dir(os.path.dirname(located), recursive=True)
            with filesystem.open_output_stream(located) as handle:
                footer = _write_parquet(rows.drop_columns(partitions), handle)
            size = int(filesystem.get_file_info(located).size or 0)
            return _added_file(
                filesystem, located, f"{prefix}/{relative}", size, literal, now_ms, footer
            )

        with optional_phase(self.clock, "write"):
            pieces = [
                (values, piece)
                for values, rows in _partition_groups(data, partitions)
                for piece in _file_pieces(rows, _FILE_ROWS)
            ]
            if len(pieces) > 1 and sum(p.num_rows for _, p in pieces) >= _PARALLEL_WRITE_ROWS:
                # Encoding Parquet releases the GIL: the pieces use every core, as a Spark
                # job's tasks would, and a step's 800k output rows cost half the time.
                workers = min(len(pieces), os.cpu_count() or 1)
                with ThreadPoolExecutor(workers, thread_name_prefix="delta-write") as pool:
                    added = list(pool.map(lambda piece: write(*piece), pieces))
            else:
                added = [write(*piece) for piece in pieces]
        logger.debug("wrote %d file(s) under %s/%s", len(added), root, prefix)
        return _durable(root, _Written.of(added))

    def _write_files(self, root: str, data: DataFrame, partitions: list[str]) -> _Written:
        prefix = uuid.uuid4().hex[:20]
        staging = f"{root.rstrip('/')}/{prefix}"
        writer = data.write.mode("error")  # "errorifexists" is not a Connect mode
        if partitions:
            writer = writer.partitionBy(*partitions)
        with optional_phase(self.clock, "write"):  # the plan's read and join run here too
            writer.parquet(staging)
        filesystem, base = _filesystem_of(staging)
        infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
        now_ms = int(datetime.now().timestamp() * 1000)
        added = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                continue
            relative = os.path.relpath(info.path, base)
            values = partition_values_from_path(os.path.dirname(relative))
            size = int(info.size or 0)
            added.append(
                _added_file(filesystem, info.path, f"{prefix}/{relative}", size, values, now_ms)
            )
        logger.debug("wrote %d file(s) under %s", len(added), staging)
        return _durable(root, _Written.of(added))

    def _commit_append(
        self,
        root: str,
        tip: _Tip,
        written: _Written,
        schema: StructType,
        partitions: list[str],
        txn: AppTransaction | None,
        commit_id: str,
    ) -> CommitOutcome:
        """Commit Add actions after the tip's version: this engine writes the commit file
        where it may; otherwise (or when another writer took that version) delta-rs
        commits, retrying on a newer version (appends never conflict)."""
        if not written.adds and txn is None:
            return CommitOutcome(table_version=tip.table_version, committed=False)
        attempted = self._log_writable(root, tip, removes=False)
        if attempted:
            own = self._commit_own(root, tip, written, None, txn, commit_id)
            if own is not None:
                return own
        table = self._handle_at(root, tip)
        base_version = table.version()
        if not attempted:  # a lost version's retry is the same commit: checked once
            crash_point("delta.before_commit")
            self._check_commit_guard()
        try:
            self._write_transaction(
                table,
                written,
                schema,
                partitions,
                self._commit_properties(txn, commit_id, self._max_commit_retries),
            )
        except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
            return self._recover_or_raise(root, base_version, commit_id, txn, e, written, "append")
        crash_point("delta.after_commit")
        return self._landed(root, base_version, commit_id, written)

    def _own_scope(
        self, root: str, tip: _Tip, where: Sequence[PartitionFilter] | None
    ) -> tuple[DataFile, ...] | None:
        """The live files at the tip's version that a replace of ``where`` (the whole
        table for None) removes, when this engine can write that commit itself; None when
        delta-rs must: the log writer may not write this table, a partition column's values
        are not integers or strings, a filter is not ``=`` or ``in`` over non-null values of
        the column's type, or a file's log path is not known."""
        if not self._log_writable(root, tip, removes=True):
            return None
        types = {f.name: f.dataType for f in tip.schema.fields}
        if not all(isinstance(types[c], _REMOVABLE_PARTITION_TYPES) for c in tip.partition_columns):
            return None
        wanted: dict[str, frozenset[Any]] = {}
        for condition in where or ():
            values = list(condition.value) if condition.op == "in" else [condition.value]
            expected = str if isinstance(types[condition.column], StringType) else int
            if condition.op not in ("=", "in") or not all(
                # A bool is not an int here; "" is left to delta-rs, which reads it as null
                # (the log's files carry null, never "", for such a partition).
                type(v) is expected and v != ""
                for v in values
            ):
                return None
            allowed = frozenset(values)
            wanted[condition.column] = wanted.get(condition.column, allowed) & allowed
        files = self.snapshot(root, tip.table_version).files
        if any(f.log_path is None for f in files):
            return None
        return tuple(
            f
            for f in files
            if all(f.partition_values.get(c) in allowed for c, allowed in wanted.items())
        )

    def _log_writable(self, root: str, tip: _Tip, removes: bool) -> bool:
        """Whether this engine writes the commit file of a commit to the table itself."""
        if not self._write_log:
            return False
        reason = writable(
            root,
            tip.min_writer_version,
            tip.writer_features,
            tip.properties,
            tip.schema_json,
            removes=removes,
        )
        if reason is not None:
            logger.debug("%s: delta-rs commits (the log writer does not write %s)", root, reason)
        return reason is None

    def _commit_own(
        self,
        root: str,
        tip: _Tip,
        written: _Written,
        removed: Sequence[DataFile] | None,
        txn: AppTransaction | None,
        commit_id: str,
    ) -> CommitOutcome | None:
        """Commit ``written``'s adds and the removes of ``removed`` (None: an append) as the
        version after the tip, by writing its commit file (``log_writer``; the caller has
        checked :meth:`_log_writable`), under the commit guard; None, having committed
        nothing, when another writer took that version (the caller then commits through
        delta-rs)."""
        version = tip.table_version + 1
        now_ms = int(datetime.now().timestamp() * 1000)
        metadata = tagged_metadata(self.commit_metadata, commit_id)
        actions: list[dict[str, Any]] = [
            commit_info_action(
                now_ms,
                "Append" if removed is None else "Overwrite",
                tip.partition_columns,
                tip.table_version,
                blind_append=removed is None,
                metadata=metadata,
            )
        ]
        actions += [
            add_action(a.path, a.size, a.partition_values, a.modification_time, a.stats)
            for a in written.adds
        ]
        for file in removed or ():
            assert file.log_path is not None  # _own_scope gives only files with one
            values = {
                c: delta_partition_literal(file.partition_values.get(c))
                for c in tip.partition_columns
            }
            actions.append(remove_action(LogFile(file.log_path, values, file.size_bytes), now_ms))
        if txn is not None:
            actions.append(txn_action(txn.app_id, txn.version, now_ms))
        crash_point("delta.before_commit")
        self._check_commit_guard()
        try:
            with optional_phase(self.clock, "commit"):
                landed = write_commit(root, version, actions)
        except OSError as e:
            # The file may have been made visible before the error surfaced (a network file
            # system retrying the link): the version is ours only if it carries our id.
            landed = self._commit_id_at(root, version) == commit_id
            if not landed:
                logger.warning(
                    "%s: cannot write commit file %d (%s); delta-rs commits", root, version, e
                )
                return None
        if not landed:
            logger.info(
                "%s: version %d was taken by another writer; delta-rs commits", root, version
            )
            return None
        crash_point("delta.after_commit")
        self._committed(root, tip, version, actions, txn)
        logger.info(
            "committed %d file(s), removed %d, to %s at version %d (commit %s)",
            len(written.adds),
            len(removed or ()),
            root,
            version,
            commit_id,
        )
        return written.outcome(version)

    def _committed(
        self,
        root: str,
        tip: _Tip,
        version: int,
        actions: Sequence[Mapping[str, Any]],
        txn: AppTransaction | None,
    ) -> None:
        """What this engine knows after writing ``version`` itself: its commit file (so
        :meth:`snapshot` replays the new version from the tip's without reading it back) and
        the new tip; a checkpoint every ``delta.checkpointInterval`` versions, as delta-rs's
        own commit makes one."""
        self._commits.put(root, version, CommitFile(version, tuple(actions)))
        txns = dict(tip.txns) | ({txn.app_id: txn.version} if txn is not None else {})
        self._hold_tip(replace(tip, table_version=version, txns=txns))
        interval = _checkpoint_interval(tip.properties)
        if (version + 1) % interval == 0:  # delta-rs's cadence: versions 99, 199, ...
            try:
                checkpointed = DeltaTable(
                    root, version=version, storage_options=storage_options(root)
                )
                checkpointed.create_checkpoint()
                if tip.properties.get("delta.enableExpiredLogCleanup", "true").lower() != "false":
                    checkpointed.cleanup_metadata()
            except Exception as e:  # noqa: BLE001 - the commit landed; a checkpoint is an aid
                logger.warning("%s: checkpoint of version %d failed: %s", root, version, e)

    def _commit_replacing(
        self,
        root: str,
        base: DeltaTable,
        replaced: frozenset[str],
        written: _Written,
        *,
        schema: StructType,
        partitions: list[str],
        filters: list[tuple[str, str, Any]] | None,
        txn: AppTransaction | None,
        commit_id: str,
        operation: str,
        scope: str,
    ) -> CommitOutcome:
        """Commit an overwrite of ``filters`` only if nothing it replaces changed since ``base``.

        delta-rs (1.6) derives the Remove actions of ``mode="overwrite"`` from the snapshot
        of the handle it is called on. When that version is taken it retries at the next
        one, and its conflict check there only refuses concurrent removes of files it read:
        files appended meanwhile into the replaced partitions (or anywhere, for a
        whole-table overwrite) are not noticed, and their rows survive a replace that never
        saw them. So every attempt here is made on a handle opened at the latest version,
        after checking that the files in scope are still exactly those of ``base``, with
        delta-rs retries off; losing the version to a concurrent commit brings the loop
        back to the check.
        """
        base_version = base.version()
        attempts = self._max_commit_retries + 1
        for attempt in range(1, attempts + 1):
            # The handle asked against, unless a newer version exists (its next commit
            # file says so, without opening the table again).
            newer = _commit_exists(root, base_version + 1)
            # A handle of its own: ``base`` stays at the version the files in scope are of.
            current = self._open(root, held=False) if newer or attempt > 1 else base
            if current.version() != base_version:
                skipped = self._skip_if_committed(root, current, txn)
                if skipped:
                    return skipped
                self._require_unchanged(
                    root, base, current, replaced, filters, operation=operation, scope=scope
                )
            attempt_version = current.version()
            crash_point("delta.before_commit")
            self._check_commit_guard()
            try:
                self._write_transaction(
                    current,
                    written,
                    schema,
                    partitions,
                    self._commit_properties(txn, commit_id, 0),
                    mode="overwrite",
                    filters=filters,
                )
            except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
                latest = self._open(root, held=False)  # ``base`` stays where it is
                if self._find_commit(latest, attempt_version, commit_id) is None and (
                    latest.version() > attempt_version
                ):
                    logger.info(
                        "%s of %s in %s lost version %d to a concurrent commit (attempt %d "
                        "of %d); checking the new version",
                        operation,
                        scope,
                        root,
                        attempt_version + 1,
                        attempt,
                        attempts,
                    )
                    continue
                return self._recover_or_raise(
                    root, attempt_version, commit_id, txn, e, written, operation
                )
            crash_point("delta.after_commit")
            return self._landed(root, attempt_version, commit_id, written)
        raise CommitError(
            f"{operation} of {scope} in {root} did not land: {attempts} attempt(s) each lost "
            f"the next version to a concurrent commit (asked against version {base_version}). "
            "The written files stay untracked and are removed by vacuum; rerunning is safe."
        )

    def _files_in_scope(
        self, root: str, table: DeltaTable, filters: list[tuple[str, str, Any]] | None
    ) -> frozenset[str]:
        """The live files an overwrite of ``filters`` (all files for None) would remove."""
        try:
            if filters is None:
                return frozenset(table.file_uris())
            return frozenset(table.file_uris(file_pruning_predicate=filters))
        except Exception as e:
            raise DeltaTableError(
                f"cannot list the files of {root} at version {table.version()} matching "
                f"{filters}: {e}"
            ) from e

    def _require_unchanged(
        self,
        root: str,
        base: DeltaTable,
        current: DeltaTable,
        replaced: frozenset[str],
        filters: list[tuple[str, str, Any]] | None,
        *,
        operation: str,
        scope: str,
    ) -> None:
        """Raise unless the commits after ``base`` left what the overwrite replaces alone."""
        base_version, current_version = base.version(), current.version()
        nothing = (
            "Nothing was committed; the written files stay untracked and are removed by "
            "vacuum. Rerun the operation against the new version."
        )
        if current.schema().to_json() != base.schema().to_json() or list(
            current.metadata().partition_columns
        ) != list(base.metadata().partition_columns):
            raise ConcurrentModificationError(
                f"{operation} of {scope} in {root}: the schema or partitioning changed "
                f"between version {base_version} (when the {operation} started) and version "
                f"{current_version}. {nothing}"
            )
        now = self._files_in_scope(root, current, filters)
        if now != replaced:
            raise ConcurrentModificationError(
                f"{operation} of {scope} in {root} conflicts with concurrent commits: between "
                f"version {base_version} (when the {operation} started) and version "
                f"{current_version}, {len(now - replaced)} file(s) were added to and "
                f"{len(replaced - now)} removed from what it replaces. {nothing}"
            )
        logger.info(
            "%s of %s in %s: versions %d..%d changed nothing it replaces; committing on %d",
            operation,
            scope,
            root,
            base_version + 1,
            current_version,
            current_version,
        )

    def _commit_id_at(self, root: str, version: int) -> str | None:
        """The commit id recorded in the commitInfo of ``version``'s commit file, or None
        (no such file, no id, or a file this reader cannot parse)."""
        try:
            found = self._commit(root, version).info.get(COMMIT_ID_KEY)
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        return found if isinstance(found, str) else None

    @staticmethod
    def _find_commit(latest: DeltaTable, after_version: int, commit_id: str) -> int | None:
        """The version after ``after_version`` whose commitInfo carries ``commit_id``."""
        newer = latest.version() - after_version
        if newer <= 0:
            return None
        for info in latest.history(newer):
            if info.get(COMMIT_ID_KEY) == commit_id and int(info["version"]) > after_version:
                return int(info["version"])
        return None

    def _landed(
        self, root: str, after_version: int, commit_id: str, written: _Written
    ) -> CommitOutcome:
        """The outcome of a commit delta-rs reported as done, at the version that is ours:
        the next version's commit file when it carries our id (no table to open), else
        the log after ``after_version`` searched for it. The tip follows the new commit
        file at the next look (:meth:`_advanced`)."""
        version = after_version + 1
        if self._commit_id_at(root, version) != commit_id:
            latest = self._open(root)
            found = self._find_commit(latest, after_version, commit_id)
            if found is None:
                # Not expected: delta-rs returned without error. Report the newest version
                # rather than fail a commit that happened.
                logger.warning(
                    "commit %s to %s succeeded but is not in the log after version %d; "
                    "reporting the latest version %d",
                    commit_id,
                    root,
                    after_version,
                    latest.version(),
                )
                found = latest.version()
            version = found
        logger.info(
            "committed %d file(s) to %s at version %d (commit %s)",
            len(written.adds),
            root,
            version,
            commit_id,
        )
        return written.outcome(version)

    def _recover_or_raise(
        self,
        root: str,
        after_version: int,
        commit_id: str,
        txn: AppTransaction | None,
        error: Exception,
        written: _Written,
        operation: str,
    ) -> CommitOutcome:
        """Treat an error as success only if the log shows that OUR commit landed, as
        :func:`~warehouse.delta.commit_protocol.outcome_after_error` decides."""
        latest = self._open(root, held=False)
        landed = self._find_commit(latest, after_version, commit_id)
        recovered = outcome_after_error(
            root,
            operation,
            commit_id,
            error,
            txn,
            ours=None if landed is None else written.outcome(landed),
            latest_version=latest.version(),
            recorded=latest.transaction_version,
        )
        if recovered is not None:
            return recovered
        raise CommitError(
            f"commit to {root} failed and did not land: {error}. The written files stay "
            "untracked and are removed by vacuum; rerunning the step is safe."
        ) from error


@dataclass(frozen=True)
class _Tip:
    """The latest version of a table as this engine knows it: what a write checks and
    commits against, without a delta-rs handle at that version.

    ``handle`` is at a version up to ``table_version``, and the commits after it hold no
    metaData or protocol action, so its schema, partitioning, properties and protocol are
    the tip's; ``txns`` holds the app transactions those commits recorded (a later txn of
    an app replaces an earlier one)."""

    root: str
    table_version: int
    handle: DeltaTable
    schema: StructType
    partition_columns: tuple[str, ...]
    properties: Mapping[str, str]
    schema_json: str
    min_writer_version: int
    writer_features: tuple[str, ...]
    txns: Mapping[str, int]

    @classmethod
    def of(cls, root: str, table: DeltaTable) -> _Tip:
        metadata = table.metadata()
        protocol = table.protocol()
        return cls(
            root=root,
            table_version=table.version(),
            handle=table,
            schema=arrow_to_spark(table.schema().to_arrow()),
            partition_columns=tuple(metadata.partition_columns),
            properties={k: v for k, v in metadata.configuration.items() if v is not None},
            schema_json=table.schema().to_json(),
            min_writer_version=protocol.min_writer_version,
            writer_features=tuple(protocol.writer_features or ()),
            txns={},
        )

    def version(self) -> int:
        return self.table_version

    def transaction_version(self, app_id: str) -> int | None:
        """The app's last recorded transaction version at the tip's version."""
        if app_id in self.txns:
            return self.txns[app_id]
        return self.handle.transaction_version(app_id)


def _checkpoint_interval(properties: Mapping[str, str]) -> int:
    """``delta.checkpointInterval`` of a table (delta-rs's 100 by default)."""
    try:
        return max(1, int(properties.get(CHECKPOINT_INTERVAL_PROPERTY, _CHECKPOINT_INTERVAL)))
    except ValueError:
        return _CHECKPOINT_INTERVAL


@dataclass(frozen=True)
class _Written:
    """Data files written for one commit, not yet referenced by the log."""

    adds: tuple[AddAction, ...]
    rows: int

    @classmethod
    def of(cls, added: Sequence[tuple[AddAction, int]]) -> _Written:
        """From (Add action, rows) pairs, as :func:`_added_file` gives them."""
        return cls(tuple(add for add, _ in added), sum(rows for _, rows in added))

    def outcome(self, version: int) -> CommitOutcome:
        return CommitOutcome(
            table_version=version,
            committed=True,
            files_added=len(self.adds),
            bytes_added=sum(a.size for a in self.adds),
            rows_added=self.rows,
        )


def _added_file(
    filesystem: pafs.FileSystem,
    located: str,
    relative: str,
    size: int,
    partition_values: Mapping[str, str | None],
    now_ms: int,
    footer: pq.FileMetaData | None = None,
) -> tuple[AddAction, int]:
    """The Add action of a written Parquet file (its statistics from its footer, read
    from the file unless the writer gave it) and its rows; ``relative`` is its path under
    the table root."""
    if footer is None:
        with filesystem.open_input_file(located) as handle:
            footer = pq.read_metadata(handle)
    add = AddAction(
        path=relative,
        size=size,
        partition_values=dict(partition_values),
        modification_time=now_ms,
        data_change=True,
        stats=delta_stats_json(footer),
    )
    return add, footer.num_rows


def _write_parquet(data: pa.Table, sink: Any) -> pq.FileMetaData:
    """``data`` as one Parquet file into ``sink``; its footer, as the writer made it.

    Only string and binary columns are dictionary-encoded: numbers, timestamps and
    booleans rarely repeat enough to pay for it (a step's output of 18,649 enriched rows
    was written in 2.8 ms instead of 4.7 ms, the file 1.5% larger).

    A nullable column whose every value here is null is left out of the file: Delta
    readers read a column a file lacks as nulls (as in a file written before the column
    was added), and so do Spark, delta-rs and this engine (:func:`_arrow_of_files`). The
    log's statistics then say nothing of it. A wide table whose rows each use a few of
    its columns (an operator's state) writes much less: 47,751 counter rows of a
    26-column state table in 2.0 ms instead of 4.0 ms."""
    data = _without_null_columns(data)
    collected: list[pq.FileMetaData] = []
    pq.write_table(
        data,
        sink,
        coerce_timestamps="us",
        use_dictionary=[
            f.name
            for f in data.schema
            if pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
        ],
        metadata_collector=collected,
    )
    return collected[0]


def _without_null_columns(data: pa.Table) -> pa.Table:
    """``data`` without its nullable columns that hold only nulls (all of them when every
    column does: a Parquet file needs one)."""
    if data.num_rows == 0:
        return data
    kept = [
        f.name
        for f, column in zip(data.schema, data.columns, strict=True)
        if not f.nullable or column.null_count < data.num_rows
    ]
    if not kept or len(kept) == data.num_columns:
        return data
    return data.select(kept)


def _partition_groups(
    data: pa.Table, partitions: Sequence[str]
) -> list[tuple[dict[str, Any], pa.Table]]:
    """``data``'s rows by their values of ``partitions`` (one group, no values, when the
    table is not partitioned); no group for no rows. Each row lands in exactly one group:
    the groups are Arrow's own (by value bits, so NaN is one group), and each takes its rows
    by position."""
    if data.num_rows == 0:
        return []
    if not partitions:
        return [({}, data)]
    keys = data.select(list(partitions))
    if all(pc.count_distinct(keys.column(c), mode="all").as_py() == 1 for c in partitions):
        # One group (a step's rows of one interval, say): the table as it is, no take.
        return [(keys.slice(0, 1).to_pylist()[0], data)]
    position = "__row_position"
    indexed = keys.append_column(position, pa.array(np.arange(data.num_rows, dtype=np.int64)))
    grouped = indexed.group_by(list(partitions)).aggregate([(position, "list")])
    lists = grouped.column(f"{position}_list")
    groups = []
    # The positions stay Arrow arrays: a group of 800k rows converted to Python ints and
    # back cost a step 0.3 s.
    for index, key in enumerate(grouped.select(list(partitions)).to_pylist()):
        groups.append((key, rows_at(data, lists[index].values)))
    return groups


def _file_pieces(rows: pa.Table, most: int) -> list[pa.Table]:
    """``rows`` in equal slices of at most ``most`` rows (one file each); none for none."""
    if rows.num_rows == 0:
        return []
    count = -(-rows.num_rows // most)
    size = -(-rows.num_rows // count)
    return [rows.slice(start, size) for start in range(0, rows.num_rows, size)]


def _arrow_of_files(
    snapshot: Snapshot,
    files: Sequence[DataFile],
    columns: Sequence[str] | None = None,
    where: pc.Expression | None = None,
) -> pa.Table:
    """The rows of ``files`` of ``snapshot`` (``columns`` of them, all by default, in that
    order), with the snapshot's Arrow types; partition values come from the log, and a
    column added to the table after a file was written reads as nulls there."""
    full = spark_to_arrow(snapshot.schema)
    names = list(full.names if columns is None else columns)
    unknown = [c for c in names if c not in full.names]
    if unknown:
        raise DeltaTableError(
            f"read of {snapshot.table_path} v{snapshot.version}: no column(s) {unknown}; "
            f"it has {full.names}"
        )
    schema = pa.schema([full.field(c) for c in names])
    stored = [c for c in names if c not in snapshot.partition_columns]
    parts = []
    for file in files:
        filesystem, located = _filesystem_of(file.path)
        with filesystem.open_input_file(located) as handle:
            parquet = pq.ParquetFile(handle)
            present = set(parquet.schema_arrow.names)
            data = parquet.read(columns=[c for c in stored if c in present])
            rows = parquet.metadata.num_rows
        out = []
        for field in schema:
            if field.name in snapshot.partition_columns:
                value = file.partition_values.get(field.name)
                out.append(pa.repeat(pa.scalar(value, type=field.type), rows))
            elif field.name in data.column_names:
                column = data.column(field.name)  # a cast to its own type would copy it
                out.append(column if column.type == field.type else column.cast(field.type))
            else:  # a column added to the table after this file was written
                out.append(pa.nulls(rows, type=field.type))
        part = pa.table(out, schema=schema)
        parts.append(part if where is None else part.filter(where))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def _durable(root: str, written: _Written) -> _Written:
    """``written``, its files flushed to disk on a local table (a commit must never outlive
    the files it names); an object store's PUT is durable when it returns."""
    if "://" not in root:
        sync_files(f"{root.rstrip('/')}/{add.path}" for add in written.adds)  # raw names
    return written


def _filesystem_of(location: str) -> tuple[pafs.FileSystem, str]:
    return filesystem_of(location)


def _exists(location: str) -> bool:
    """Whether a file is at ``location`` (a stat here, a HEAD request on an object store)."""
    if "://" not in location:
        return os.path.exists(location)
    filesystem, path = filesystem_of(location)
    return filesystem.get_file_info(path).type != pafs.FileType.NotFound


def _commit_exists(root: str, version: int) -> bool:
    """Whether ``version``'s commit file exists: a stat, or one HEAD request (a pyarrow
    look-up of a missing key also lists it as a folder)."""
    if is_object_store(root):
        return object_stamp(commit_file_location(root, version)) is not None
    return _exists(commit_file_location(root, version))


def _link_or_copy(source: str, destination: str) -> None:
    """A hard link of a local file, else a copy (across file systems, on object stores)."""
    if "://" not in source and "://" not in destination:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        try:
            os.link(source, destination)
            return
        except OSError as e:  # another device, or a file system without hard links
            logger.debug("cannot link %s (%s); copying it", source, e)
    source_fs, source_path = _filesystem_of(source)
    target_fs, target_path = _filesystem_of(destination)
    if type(source_fs) is type(target_fs):
        target_fs.create_dir(os.path.dirname(target_path), recursive=True)
        target_fs.copy_file(source_path, target_path)
        return
    pafs.copy_files(
        source_path, target_path, source_filesystem=source_fs, destination_filesystem=target_fs
    )


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


def _check_partition_predicate(
    root: str, partitions: Sequence[str], where: Sequence[PartitionFilter], operation: str
) -> None:
    """Refuse a replace or delete without a predicate, or with one over data columns."""
    if not where or any(f.column not in partitions for f in where):
        raise UnsupportedOperationError(
            f"{operation} on {root} needs a predicate over partition columns {list(partitions)}; "
            f"got columns {[f.column for f in where]}. Predicates on data columns need the "
            "native delta-spark engine."
        )


def _rows_outside(root: str, where: Sequence[PartitionFilter]) -> DeltaTableError:
    return DeltaTableError(
        f"replace on {root}: the data has rows outside the replace predicate "
        f"{describe_filters(where)}; they would survive a later replace of the same range"
    )


def _arrow_condition(where: Sequence[PartitionFilter], data: pa.Table) -> pa.ChunkedArray:
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


def _partition_key(file: DataFile) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(file.partition_values.items()))
