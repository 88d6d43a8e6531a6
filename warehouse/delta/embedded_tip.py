"""The embedded engine's read caches and each table's tip: its latest version as known.

A table's tip (:class:`Tip`) holds the schema, partitioning, properties, protocol and app
transactions a write checks. It is kept while no later commit file exists and brought
forward over other writers' commit files, so a write does not open the table; a delta-rs
handle is opened once and moved only when a delta-rs operation needs it
(:class:`TableTips`). Commit files are parsed once per version (``commit_file``); the
caches are per version and checked against the commit files when served
(``version_cache``), so the engines of one process share them (:class:`ReadCaches`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field

import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError as DeltaRsTableNotFound
from pyspark.sql.types import StructType

from common.errors import DeltaTableError, TableNotFoundError
from warehouse.delta.api import Snapshot
from warehouse.delta.commit_file import CommitFile
from warehouse.delta.commit_protocol import COMMIT_ID_KEY
from warehouse.delta.features import require_readable
from warehouse.delta.schema import arrow_to_spark
from warehouse.delta.table_paths import commit_file_location, table_root
from warehouse.delta.version_cache import VersionCache
from warehouse.object_store import filesystem_of, is_object_store, object_stamp, storage_options

logger = logging.getLogger(__name__)

# Snapshots an engine keeps by version (see warehouse.delta.embedded_reads.Snapshots).
SNAPSHOTS_KEPT = 256
# The most commits a snapshot is replayed over from an earlier one (beyond, it is listed),
# and the most a held handle may fall behind its tip.
REPLAYED_COMMITS = 64
# Parsed commit files an engine keeps (a few KB each).
COMMITS_KEPT = 4096


@dataclass(frozen=True)
class ReadCaches:
    """What embedded engines have read, by table version: every entry is checked against
    the table's commit files when served (:mod:`warehouse.delta.version_cache`), so the
    engines of one process may share them; a warm worker's commands then open each table
    once, not once a command."""

    snapshots: VersionCache[Snapshot] = dataclass_field(
        default_factory=lambda: VersionCache(SNAPSHOTS_KEPT)
    )
    tips: VersionCache[Tip] = dataclass_field(default_factory=lambda: VersionCache(SNAPSHOTS_KEPT))
    commits: VersionCache[CommitFile] = dataclass_field(
        default_factory=lambda: VersionCache(COMMITS_KEPT)
    )


@dataclass(frozen=True)
class Tip:
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
    def of(cls, root: str, table: DeltaTable) -> Tip:
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


class TableTips:
    """The tips of the tables an engine reaches, their delta-rs handles, and the commit
    files it has parsed (both shared through :class:`ReadCaches`)."""

    def __init__(self, caches: ReadCaches) -> None:
        # The latest version of each table as this engine knows it (``Tip``), served while
        # no newer commit file exists: opening a table replays its log from the last
        # checkpoint (about 10-20 ms locally; on an object store a listing and a GET of every
        # commit since the checkpoint), several times a step. The engine's own commit makes
        # the next tip; another writer's commits bring it forward from their commit files.
        self.cache = caches.tips
        # Commit files by (root, version), parsed once: admission reads the row counts of
        # the next 256 input versions every step, and a range's reads ask each version's
        # actions, data-change flags and commitInfo again.
        self.commits = caches.commits

    def open(self, path: str, version: int | None = None, held: bool = True) -> DeltaTable:
        """A delta-rs handle on ``path`` at ``version`` (the latest by default). The latest
        is the held handle of the table's tip (:meth:`tip`), moved to the tip's version
        when it is behind (this engine's own commits do not move it); ``held=False`` opens a
        handle of the caller's own (one it may keep while the table moves on)."""
        root = table_root(path)
        if version is None and held:
            moved = self.tip_handle(root, self.tip(root))
            return moved if moved is not None else self.held_tip(root).handle
        return self.open_table(root, version)

    def open_table(self, root: str, version: int | None = None) -> DeltaTable:
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

    def tip(self, root: str) -> Tip:
        """The table's latest version as this engine knows it (:class:`Tip`): the one it
        holds while no later commit file exists; else that one brought forward over the
        commits since (another writer's appends: a small read each); else a fresh open."""
        known = self.cache.latest(root)
        if known is not None:
            return known
        older = self.cache.latest_before(root, sys.maxsize)
        if older is not None:
            advanced = self.advanced(root, older[1])
            if advanced is not None:
                return advanced
        return self.held_tip(root)

    def held_tip(self, root: str) -> Tip:
        """The tip of a fresh open of the latest version, held from now on."""
        tip = Tip.of(root, self.open_table(root))
        self.hold(tip)
        return tip

    def hold(self, tip: Tip) -> None:
        self.cache.drop_table(tip.root)  # only the newest tip is ever served
        self.cache.put(tip.root, tip.table_version, tip)

    def advanced(self, root: str, tip: Tip) -> Tip | None:
        """``tip`` brought to the latest version over the commit files after it, or None
        where a commit may change what a tip holds (a metaData or protocol action), a
        commit file is gone or unreadable, or the held handle would fall more than
        :data:`REPLAYED_COMMITS` behind."""
        txns = dict(tip.txns)
        version = tip.table_version
        while commit_exists(root, version + 1):
            if version + 1 - tip.handle.version() > REPLAYED_COMMITS:
                return None
            try:
                commit = self.commit(root, version + 1)
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
        self.hold(advanced)
        return advanced

    def tip_handle(self, root: str, tip: Tip) -> DeltaTable | None:
        """The tip's own delta-rs handle at the tip's version: moved there when it is
        behind by at most :data:`REPLAYED_COMMITS` and the tip is still the one held (a
        handle is moved only forward, over commits :meth:`advanced` accepted); None when
        it cannot be."""
        handle = tip.handle
        behind = tip.table_version - handle.version()
        if 0 < behind <= REPLAYED_COMMITS and self.cache.get(root, tip.table_version) is tip:
            try:
                handle.load_as_version(tip.table_version)
            except Exception as e:  # noqa: BLE001 - delta-rs raises several types
                logger.debug("%s: cannot move the held handle: %s", root, e)
        return handle if handle.version() == tip.table_version else None

    def handle_at(self, root: str, tip: Tip) -> DeltaTable:
        """A delta-rs handle at exactly the tip's version, for a commit through delta-rs
        made against it: the tip's own, else one opened at that version."""
        moved = self.tip_handle(root, tip)
        return moved if moved is not None else self.open_table(root, tip.table_version)

    def commit(self, root: str, version: int) -> CommitFile:
        """``version``'s commit file, parsed; OSError when it is not there, ValueError
        when a line is not JSON."""
        known = self.commits.get(root, version)
        if known is not None:
            return known
        commit = CommitFile.parse(version, _commit_text(root, version))
        self.commits.put(root, version, commit)
        return commit

    def commit_id_at(self, root: str, version: int) -> str | None:
        """The commit id recorded in the commitInfo of ``version``'s commit file, or None
        (no such file, no id, or a file this reader cannot parse)."""
        try:
            found = self.commit(root, version).info.get(COMMIT_ID_KEY)
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
            return None
        return found if isinstance(found, str) else None


def _commit_text(root: str, version: int) -> str:
    filesystem, base = filesystem_of(commit_file_location(root, version))
    with filesystem.open_input_stream(base) as handle:
        return str(handle.read().decode("utf-8"))


def commit_exists(root: str, version: int) -> bool:
    """Whether ``version``'s commit file exists: a stat, or one HEAD request (a pyarrow
    look-up of a missing key also lists it as a folder)."""
    if is_object_store(root):
        return object_stamp(commit_file_location(root, version)) is not None
    return _exists(commit_file_location(root, version))


def _exists(location: str) -> bool:
    """Whether a file is at ``location`` (a stat here, a HEAD request on an object store)."""
    if "://" not in location:
        return os.path.exists(location)
    filesystem, path = filesystem_of(location)
    return filesystem.get_file_info(path).type != pafs.FileType.NotFound
