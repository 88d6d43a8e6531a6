"""What both Delta engines do the same way, around the parts that are each engine's own.

:class:`EngineBase` holds the settings of the :class:`~warehouse.delta.api.DeltaEngine`
protocol (commit guard, commit metadata, table properties, phase clock) and answers the
calls whose logic does not depend on how the log is read or the data written:

- ``create_table``: an existing table is accepted when its definition matches; a new one
  starts with the engine's table properties, the call's own winning;
- ``append``: with ``partition_by`` a missing table is created first;
- ``changes`` and ``rows_added``: the range check, the change data feed switch, and the
  replay of the range's file actions (:mod:`warehouse.delta.added_files`) whose files
  :mod:`warehouse.delta.added_rows` reads;
- ``append_rows``: through Spark, the path an engine without a driver-side write takes;
- ``compact``: what a bin-packing run did, from its metrics and the versions around it.

Each engine supplies the hooks these call (the abstract methods): how it reads the log,
reads files and writes. Where the two engines only look alike (their snapshot caches, the
commit and recovery paths, replace, merge, vacuum) each keeps its own code.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import pyarrow as pa

from warehouse.delta.added_files import FileAction, live_files_by_version
from warehouse.delta.added_rows import (
    appended_changes,
    change_feed_enabled,
    change_schema,
    require_version_range,
    rows_added_frame,
)
from warehouse.delta.api import AppTransaction, CommitOutcome, Compaction, Snapshot
from warehouse.delta.commit_protocol import COMMIT_ID_KEY, new_commit_id
from warehouse.delta.schema import (
    arrow_to_spark,
    require_partition_columns,
    require_same_definition,
)
from warehouse.delta.table_paths import table_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from common.phase_clock import PhaseClock

logger = logging.getLogger(__name__)

Payload = TypeVar("Payload")
# (version, adds, removes) of each commit of a range, as added_files replays them.
FileActions = Iterator[tuple[int, list[FileAction[Payload]], list[FileAction[Payload]]]]


@dataclass(frozen=True)
class RangeEnd(Generic[Payload]):
    """The last version of a range of commits, as ``changes`` and ``rows_added`` read it."""

    snapshot: Snapshot
    read: Callable[[list[Payload]], DataFrame]
    """Reads the files of some of the range's Add actions (their payloads) as of
    ``snapshot``, in its columns."""


class EngineBase(ABC, Generic[Payload]):
    """The engine-neutral part of a :class:`~warehouse.delta.api.DeltaEngine`; ``Payload``
    is what the engine's file actions carry to read a file again."""

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
        # Called right before every commit; raising stops the commit (a lost lease).
        self.commit_guard: Callable[[], None] | None = commit_guard
        # Extra entries recorded with every commit (the pipeline's run id, say).
        self.commit_metadata: Mapping[str, str] = dict(commit_metadata or {})
        self.table_properties: Mapping[str, str] = dict(table_properties or {})
        self.clock: PhaseClock | None = None

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
        if not self._create(root, schema, partition_by, configuration):
            return require_same_definition(self._definition(root), schema, partition_by)
        logger.info("created Delta table %s partitioned by %s", root, list(partition_by))
        return 0

    @abstractmethod
    def _definition(self, root: str) -> Snapshot:
        """The latest version's schema, partitioning and properties (its files optional)."""

    @abstractmethod
    def _create(
        self,
        root: str,
        schema: StructType,
        partition_by: Sequence[str],
        configuration: Mapping[str, str],
    ) -> bool:
        """Create the table; False when another process created it meanwhile."""

    @abstractmethod
    def _latest_version(self, root: str) -> int:
        """The table's newest version."""

    # ------------------------------------------------------------------ version ranges

    def changes(self, path: str, after_version: int, to_version: int) -> DataFrame:
        """Rows added or changed in versions ``(after_version, to_version]``.

        The change data feed when the table enables it; otherwise the table must have been
        append-only over the range, and the answer is the rows of the files added, tagged
        ``insert``: a data-changing remove raises :class:`NotAppendOnlyError`.
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
        """Rows of files added in ``(after_version, to_version]`` whose rows are still live.

        Each row carries ``_commit_version``, the version that added its file. Files a later
        commit of the range removed with ``dataChange=true`` (a replace) are left out, and so
        are files added by the versions in ``skip_versions``; a file a compaction rewrote
        (``dataChange=false``) is read as it was added.
        """
        end, by_version = self._added_by_version(path, after_version, to_version, skip_versions)
        return rows_added_frame(self._spark, end.snapshot.schema, by_version, end.read)

    def _added_by_version(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int],
    ) -> tuple[RangeEnd[Payload], dict[int, list[Payload]]]:
        """The range's last version and the payloads of the still-live files each version
        of ``(after_version, to_version]`` added, but for ``skip_versions``, by version."""
        root = table_root(path)
        require_version_range(f"rows added to {root}", after_version, to_version)
        end = self._range_end(root, to_version)
        actions = self._file_actions(root, after_version, to_version)
        return end, live_files_by_version(root, actions, skip_versions)

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
        """Add ``data``'s rows in one commit; with ``partition_by`` a missing table is
        created first (an existing one must have that definition)."""
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
        """The rows as a DataFrame, appended as any other (one Spark job)."""
        return self.append(path, self._spark.createDataFrame(list(rows), schema), txn)

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

    def compact(self, path: str, target_file_bytes: int) -> Compaction:
        """Bin-pack the small files in one commit of ``dataChange=false`` actions, under the
        commit guard and with this engine's commit metadata."""
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
