"""The ``DeltaEngine`` contract: every operation the pipeline needs from a Delta table, once.

Invariants every engine keeps:

- A commit that carries an :class:`~warehouse.delta.api.AppTransaction` lands at most
  once. If the table already records that app id at a version >= the transaction's
  version, the commit is skipped and reported as ``committed=False``.
- ``committed=True`` means this call's own commit landed, at ``table_version``: a commit
  of another writer, even one recording the same app transaction, is never reported as ours.
- ``replace``, ``overwrite`` and ``delete_partitions`` never commit over a concurrent change
  to what they replace: they raise :class:`~common.errors.ConcurrentModificationError` and
  commit nothing, so a retry is clean. Concurrent changes elsewhere in the table do not
  conflict.
- ``commit_guard``, when set, runs before every commit; if it raises, nothing is committed.
- Reads only ever see files referenced by the pinned snapshot's log, never files merely
  present in the table directory.

:class:`DeltaEngine` declares each operation once, with its documentation. Where the logic
does not depend on how the log is read or the data written (a table's creation, an append
that creates its table, the range checks and replay of ``changes`` and ``rows_added``,
compaction's report) it is written here, around hooks each engine supplies (the abstract
methods). The driver-side Arrow paths (``read_arrow``, ``rows_added_arrow``,
``count_rows_added``, ``append_rows_added``, ``append_rows``) default to Spark here; an
engine that can do them without a Spark job overrides their hooks.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypedDict, TypeVar

import pyarrow as pa

from warehouse.delta.added_files import FileAction, live_files_by_version
from warehouse.delta.added_rows import (
    appended_changes,
    change_feed_enabled,
    change_schema,
    require_version_range,
    rows_added_frame,
)
from warehouse.delta.api import (
    COMMIT_VERSION,
    AppTransaction,
    CommitOutcome,
    Compaction,
    DataFile,
    PartitionFilter,
    RowMask,
    Snapshot,
    known_total,
)
from warehouse.delta.commit_protocol import COMMIT_ID_KEY, new_commit_id
from warehouse.delta.schema import (
    arrow_to_spark,
    require_partition_columns,
    require_same_definition,
)
from warehouse.delta.table_paths import table_root

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from common.phase_clock import PhaseClock

logger = logging.getLogger(__name__)

Payload = TypeVar("Payload")
# (version, adds, removes) of each commit of a range, as added_files replays them.
FileActions = Iterator[tuple[int, list[FileAction[Payload]], list[FileAction[Payload]]]]
Txn: TypeAlias = "AppTransaction | None"


class EngineSettings(TypedDict, total=False):
    """The settings every engine takes (see :class:`DeltaEngine`'s attributes)."""

    commit_guard: Callable[[], None] | None
    commit_metadata: Mapping[str, str] | None
    table_properties: Mapping[str, str] | None


@dataclass(frozen=True)
class RangeEnd(Generic[Payload]):
    """The last version of a range of commits, as ``changes`` and ``rows_added`` read it."""

    snapshot: Snapshot
    read: Callable[[list[Payload]], DataFrame]
    """Reads the files of some of the range's Add actions (their payloads) as of
    ``snapshot``, in its columns."""


@dataclass(frozen=True)
class NewTable:
    """A table to create: its schema, partition columns and table properties."""

    schema: StructType
    partition_by: Sequence[str]
    configuration: Mapping[str, str]


@dataclass(frozen=True)
class ArrowRead:
    """What :meth:`DeltaEngine.read_arrow` reads: ``files`` of ``snapshot`` (all when
    None), only ``columns`` (all when None), only the rows ``where`` holds for."""

    snapshot: Snapshot
    files: Sequence[DataFile] | None
    columns: Sequence[str] | None
    where: RowMask | None


@dataclass(frozen=True)
class AddedRange:
    """The rows of the files added to the table at ``root`` in ``(after_version,
    to_version]`` and still live at ``to_version``, but for the files ``skip_versions`` added."""

    root: str
    after_version: int
    to_version: int
    skip_versions: Sequence[int] = ()


@dataclass(frozen=True)
class ReplaceScope:
    """What a replace replaces (the partitions ``where`` selects) and the app transaction
    it commits under."""

    where: Sequence[PartitionFilter]
    txn: AppTransaction | None


@dataclass(frozen=True)
class MergeOn:
    """How a merge matches: the key columns, and the source column whose true value makes
    a matched row a delete (None: no deletes)."""

    keys: Sequence[str]
    delete_flag: str | None


class DeltaEngine(ABC, Generic[Payload]):
    """Operations the pipeline needs from a Delta table, whatever engine is underneath;
    ``Payload`` is what the engine's file actions carry to read a file again."""

    name: str
    arrow_in_driver: bool
    """Whether Arrow reads and writes (:meth:`read_arrow`, :meth:`rows_added_arrow`, and
    :meth:`append`, :meth:`overwrite`, :meth:`replace` of Arrow rows) run in the driver
    without a Spark job (the embedded engine); otherwise they go through Spark, and a
    caller that reads or writes Arrow only to avoid Spark jobs keeps to its Spark path."""

    # Keys the engine writes into every commit itself: commit_metadata must not shadow them.
    _reserved_commit_keys: frozenset[str] = frozenset({COMMIT_ID_KEY})

    def __init__(
        self,
        session: SparkSession,
        *,
        commit_guard: Callable[[], None] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
        table_properties: Mapping[str, str] | None = None,
    ) -> None:
        self._spark = session
        self.commit_guard: Callable[[], None] | None = commit_guard
        """Called right before every commit, after the data files are written. If it
        raises, nothing is committed and the error propagates (the lease fencing check)."""
        self.commit_metadata: Mapping[str, str] = dict(commit_metadata or {})
        """Extra entries recorded with every commit (the run id, say), for audit."""
        self.table_properties: Mapping[str, str] = dict(table_properties or {})
        """Table properties every table this engine creates starts with (a
        ``create_table`` call's own ``properties`` win): the checkpoint interval, say."""
        self.clock: PhaseClock | None = None
        """When set, the time of file writes (``write``) and log commits (``commit``) is
        charged to these phases, for the per-task timings of the run report."""

    # ------------------------------------------------------------------ tables

    @abstractmethod
    def exists(self, path: str) -> bool:
        """Whether a Delta table is at ``path``."""

    def create_table(
        self,
        path: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> int:
        """Create the table, or accept an existing one with the same schema and partitioning."""
        root = table_root(path)
        if self.exists(root):
            return require_same_definition(self._definition(root), schema, partition_by)
        require_partition_columns(root, schema, partition_by)
        configuration = {**self.table_properties, **(properties or {})}
        if not self._create(root, NewTable(schema, partition_by, configuration)):
            return require_same_definition(self._definition(root), schema, partition_by)
        logger.info("created Delta table %s partitioned by %s", root, list(partition_by))
        return 0

    @abstractmethod
    def _definition(self, root: str) -> Snapshot:
        """The latest version's schema, partitioning and properties (its files optional)."""

    @abstractmethod
    def _create(self, root: str, table: NewTable) -> bool:
        """Create the table; False when another process created it meanwhile."""

    @abstractmethod
    def _latest_version(self, root: str) -> int:
        """The table's newest version."""

    # ------------------------------------------------------------------ reads

    @abstractmethod
    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        """The table at ``version`` (or as of ``timestamp``; the latest when neither)."""

    @abstractmethod
    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        """Read ``files`` of ``snapshot`` (all of them by default) as one DataFrame."""

    @abstractmethod
    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame:
        """The table's rows at ``version`` (or as of ``timestamp``; the latest when neither)."""

    def read_arrow(
        self,
        snapshot: Snapshot,
        files: Sequence[DataFile] | None = None,
        columns: Sequence[str] | None = None,
        where: RowMask | None = None,
    ) -> pa.Table:
        """The rows :meth:`read_files` reads (only ``columns``, in that order, all by
        default) in the driver's memory as Arrow, only those ``where`` keeps (a mask of the
        rows read, :data:`~warehouse.delta.api.RowMask`). For data the caller knows is
        small once filtered; an engine that can reads the files without a Spark job, a
        file at a time."""
        if where is not None and not callable(where):
            # pyarrow is untyped, so a type checker lets an Arrow expression through.
            raise TypeError(
                "read_arrow's where: expected a function of the rows read returning a "
                f"boolean mask (RowMask), found {type(where).__name__}"
            )
        return self._read_arrow(ArrowRead(snapshot, files, columns, where))

    def _read_arrow(self, read: ArrowRead) -> pa.Table:
        """Through Spark (one job); ``where`` is applied to the collected rows."""
        frame = self.read_files(read.snapshot, read.files)
        table = frame.select(*(read.columns or frame.columns)).toArrow()
        return table if read.where is None else table.filter(read.where(table))

    @abstractmethod
    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        """The table's commits, newest first, each as its commit information."""

    def commit_infos(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, Mapping[str, Any]]]:
        """Each version of ``(after_version, to_version]`` with its commit information as
        :meth:`history` gives an entry (``commit_metadata`` keys included), oldest first.

        From the history: every commit from the latest back to ``after_version`` is read,
        so an engine that can read a version's commit information alone does that instead.
        """
        if to_version <= after_version:
            return []
        latest = self.snapshot(path).version
        entries = [
            (int(h["version"]), h)
            for h in self.history(path, limit=latest - after_version)
            if after_version < int(h["version"]) <= to_version
        ]
        return sorted(entries, key=lambda entry: entry[0])

    @abstractmethod
    def transaction_version(self, path: str, app_id: str) -> int | None:
        """The version of ``app_id``'s last transaction the table records (None: none)."""

    # ------------------------------------------------------------------ version ranges

    def changes(self, path: str, after_version: int, to_version: int) -> DataFrame:
        """Every row change of the commits ``(after_version, to_version]``.

        Each row carries ``CHANGE_TYPE`` (one of ``ADDED_CHANGES`` or ``REMOVED_CHANGES``)
        and ``COMMIT_VERSION``. From the change data feed when the table enables it
        (``CDF_PROPERTY``); otherwise the range must be append-only and every row is an
        ``INSERT`` of a file added with ``dataChange=true``, and a commit that removed a file
        with ``dataChange=true`` raises :class:`NotAppendOnlyError` (its removed rows cannot
        be known). A compaction (its actions all ``dataChange=false``) changes no row and
        adds none. A reader that wants only the rows added, whatever was removed, asks
        :meth:`rows_added`.
        """
        root = table_root(path)
        require_version_range(f"changes of {root}", after_version, to_version)
        end = self._range_end(root, to_version)
        schema = change_schema(end.snapshot.schema)
        if to_version == after_version:
            return self._spark.createDataFrame([], schema)
        if change_feed_enabled(end.snapshot):
            return self._change_feed(root, after_version, to_version, schema)
        return appended_changes(
            self._spark,
            root,
            self._file_actions(root, after_version, to_version),
            end.read,
            schema,
        )

    def rows_added(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
    ) -> DataFrame:
        """Rows of the files added in ``(after_version, to_version]`` whose rows are still
        live at ``to_version``.

        Only ``dataChange=true`` actions move rows: a file a later commit of the range
        removed with ``dataChange=true`` (a replace) is left out, and a compaction, which
        rewrites files with ``dataChange=false``, neither adds rows nor drops any. Rows of a
        file a compaction replaced are read from that file (as its last Add action in the
        range describes it), so the caller must keep such files until it has read them:
        ``enrich maintain`` keeps every file removed after a pinned version of a followed
        table. Each row carries ``_commit_version`` (the version that added its file);
        files added by ``skip_versions`` are left out. A write-audit-publish batch is
        exactly this.
        """
        added = AddedRange(table_root(path), after_version, to_version, tuple(skip_versions))
        end, by_version = self._added_by_version(added)
        return rows_added_frame(self._spark, end.snapshot.schema, by_version, end.read)

    def rows_added_arrow(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
        with_version: bool = False,
    ) -> pa.Table:
        """The rows :meth:`rows_added` returns, without ``_commit_version`` (unless
        ``with_version``: then last, as there), in the driver's memory as an Arrow table with
        the table's columns in order. For batches the caller knows are small; an engine that
        can reads the files without a Spark job."""
        added = AddedRange(table_root(path), after_version, to_version, tuple(skip_versions))
        return self._added_arrow(added, with_version)

    def _added_arrow(self, added: AddedRange, with_version: bool) -> pa.Table:
        """Through Spark (one job)."""
        rows = self.rows_added(
            added.root, added.after_version, added.to_version, added.skip_versions
        )
        return (rows if with_version else rows.drop(COMMIT_VERSION)).toArrow()

    def count_rows_added(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
    ) -> int | None:
        """How many rows :meth:`rows_added` would return, from the log's record counts with
        no data read; None when the log cannot tell (a file without statistics)."""
        return self._count_added(
            AddedRange(table_root(path), after_version, to_version, tuple(skip_versions))
        )

    def _count_added(self, added: AddedRange) -> int | None:
        """The live rows of the files :meth:`rows_added` reads, each file's from its log
        entry (:meth:`_live_records`): no data read, no snapshot built."""
        root = added.root
        require_version_range(f"rows added to {root}", added.after_version, added.to_version)
        return known_total(
            self._live_records(payload)
            for files in self._live_added(added).values()
            for payload in files
        )

    @abstractmethod
    def _live_records(self, payload: Payload) -> int | None:
        """A live file's rows from its log entry; None when its statistics do not say."""

    @abstractmethod
    def rows_by_version(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, int]]:
        """``(version, rows of the data files it added)`` for each version in ``(after, to]``.

        From the log's file statistics alone (no data is read): what a consumer that admits
        input a version at a time needs to size its intake.
        """

    def _added_by_version(
        self, added: AddedRange
    ) -> tuple[RangeEnd[Payload], dict[int, list[Payload]]]:
        """The range's last version and the payloads of its still-live files by version."""
        root = added.root
        require_version_range(f"rows added to {root}", added.after_version, added.to_version)
        return self._range_end(root, added.to_version), self._live_added(added)

    def _live_added(self, added: AddedRange) -> dict[int, list[Payload]]:
        """The payloads of the range's still-live files by version, from its log actions
        alone (no snapshot built); the caller has checked the range."""
        actions = self._file_actions(added.root, added.after_version, added.to_version)
        return live_files_by_version(added.root, actions, added.skip_versions)

    @abstractmethod
    def _range_end(self, root: str, version: int) -> RangeEnd[Payload]:
        """``version`` of the table as a range ending there reads it."""

    @abstractmethod
    def _file_actions(self, root: str, after_version: int, to_version: int) -> FileActions[Payload]:
        """(version, adds, removes) of each commit in ``(after_version, to_version]``, in
        version order; each add carries its payload."""

    @abstractmethod
    def _change_feed(
        self, root: str, after_version: int, to_version: int, schema: StructType
    ) -> DataFrame:
        """The change data feed of ``(after_version, to_version]`` (a non-empty range) in
        ``schema``, :func:`~warehouse.delta.added_rows.change_schema`'s."""

    # ------------------------------------------------------------------ writes

    def append(
        self,
        path: str,
        data: DataFrame | pa.Table,
        txn: AppTransaction | None = None,
        partition_by: Sequence[str] | None = None,
    ) -> CommitOutcome:
        """Add ``data``'s rows in one commit: a Spark frame, or rows the driver holds as
        Arrow (columns by name, of the table's types or castable to them; an engine that
        can writes those without a Spark job). With ``partition_by`` a missing table is
        created first (the data's schema, those partition columns), and an existing one must
        have that definition; without it the table must exist."""
        if partition_by is not None:
            schema = arrow_to_spark(data.schema) if isinstance(data, pa.Table) else data.schema
            self.create_table(path, schema, partition_by)
        return self._append(path, data, txn)

    @abstractmethod
    def _append(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None
    ) -> CommitOutcome:
        """Add ``data``'s rows to the existing table in one commit."""

    def append_rows(
        self,
        path: str,
        rows: Sequence[tuple[Any, ...]],
        schema: StructType,
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Append a few rows the driver holds (an audit's results, a report) to an existing
        unpartitioned table with ``schema``, in one commit carrying ``txn``. An engine that
        can writes them without a Spark job."""
        written = self._append_in_driver(table_root(path), rows, schema, txn)
        if written is not None:
            return written
        return self.append(path, self._spark.createDataFrame(list(rows), schema), txn)

    def _append_in_driver(
        self, root: str, rows: Sequence[tuple[Any, ...]], schema: StructType, txn: Txn
    ) -> CommitOutcome | None:
        """Append ``rows`` without a Spark job; None where this engine cannot (the default)."""
        return None

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
        """Append to ``target`` exactly the rows :meth:`rows_added` of ``source`` returns
        (without ``_commit_version``), in one commit carrying ``txn``.

        ``target`` is created with ``source``'s schema and ``partition_by`` when missing and
        must have that schema. An engine that can, adds the source's files themselves (the
        rows are whole files) instead of reading and rewriting them.
        """
        added = AddedRange(table_root(source), after_version, to_version, tuple(skip_versions))
        linked = self._append_files_added(added, target, txn, partition_by)
        if linked is not None:
            return linked
        rows = self.rows_added(source, after_version, to_version, skip_versions)
        return self.append(target, rows.drop(COMMIT_VERSION), txn, partition_by)

    def _append_files_added(
        self, added: AddedRange, target: str, txn: Txn, partition_by: Sequence[str] | None
    ) -> CommitOutcome | None:
        """Add the range's files themselves to ``target``; None where this engine reads
        and writes the rows instead (the default: delta-spark writes every file it commits)."""
        return None

    def replace(
        self,
        path: str,
        data: DataFrame | pa.Table,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Atomically replace the rows of the partitions ``where`` selects with ``data``
        (a Spark frame or Arrow rows, as :meth:`append` takes them); rows outside them are
        refused."""
        return self._replace(table_root(path), data, ReplaceScope(where, txn))

    @abstractmethod
    def _replace(self, root: str, data: DataFrame | pa.Table, scope: ReplaceScope) -> CommitOutcome:
        """:meth:`replace` at the table's root."""

    @abstractmethod
    def overwrite(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """Atomically replace the whole table's rows with ``data`` (a Spark frame or Arrow
        rows, as :meth:`append` takes them)."""

    @abstractmethod
    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """Atomically remove the partitions ``where`` selects; no data is read or written."""

    def merge(
        self,
        path: str,
        source: DataFrame,
        keys: Sequence[str],
        delete_flag: str | None = None,
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Upsert ``source`` by ``keys``; rows whose ``delete_flag`` is true delete instead.

        How a master changes (slowly changing dimensions): the pipeline itself never merges
        into the tables it owns, but SSBJ follows a merged master through :meth:`changes`.
        One commit, exactly once under ``txn``.
        """
        return self._merge(table_root(path), source, MergeOn(tuple(keys), delete_flag), txn)

    @abstractmethod
    def _merge(self, root: str, source: DataFrame, on: MergeOn, txn: Txn) -> CommitOutcome:
        """:meth:`merge` at the table's root."""

    # ------------------------------------------------------------------ commits

    def _new_commit_id(self) -> str:
        """A fresh commit id; also refuses commit metadata that would shadow log keys."""
        return new_commit_id(self.commit_metadata, self._reserved_commit_keys)

    def _check_commit_guard(self) -> None:
        # Runs after the data files exist (the embedded engine) or right before the call that
        # writes and commits them (delta-spark), never after a commit: a guard that raises (a
        # lost lease) leaves at most untracked files, which vacuum removes.
        if self.commit_guard is not None:
            self.commit_guard()

    # ------------------------------------------------------------------ maintenance

    @abstractmethod
    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]:
        """Delete unreferenced files older than the retention, but those ``keep_versions``
        reference; the paths deleted."""

    def compact(self, path: str, target_file_bytes: int) -> Compaction:
        """Rewrite the small files of each partition into files of about the target size,
        in one commit whose actions all have ``dataChange=false``: every version keeps the
        same rows (the replaced files stay on disk until a vacuum, so older versions still
        read), and :meth:`rows_added` and :meth:`changes` see no change in it."""
        root = table_root(path)
        before, metrics = self._bin_pack(root, int(target_file_bytes))
        removed, added = int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])
        version = self._latest_version(root)
        logger.info("compacted %s: %d file(s) into %d", root, removed, added)
        return Compaction(removed, added, version if version > before else None)

    @abstractmethod
    def _bin_pack(self, root: str, target_file_bytes: int) -> tuple[int, Mapping[str, Any]]:
        """Run the engine's compaction under the commit guard: the version it started from,
        and its metrics (``numFilesRemoved``, ``numFilesAdded``, as both engines name them)."""
