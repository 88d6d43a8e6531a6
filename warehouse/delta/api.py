"""The engine-neutral Delta API: value types, the ``DeltaEngine`` protocol, engine choice.

Invariants every engine keeps:

- A commit that carries an :class:`AppTransaction` lands at most once. If the table already
  records that app id at a version >= the transaction's version, the commit is skipped and
  reported as ``committed=False``.
- ``committed=True`` means this call's own commit landed, at ``table_version``: a commit
  of another writer, even one recording the same app transaction, is never reported as ours.
- ``replace``, ``overwrite`` and ``delete_partitions`` never commit over a concurrent change
  to what they replace: they raise :class:`~common.errors.ConcurrentModificationError` and
  commit nothing, so a retry is clean. Concurrent changes elsewhere in the table do not
  conflict.
- ``commit_guard``, when set, runs before every commit; if it raises, nothing is committed.
- Reads only ever see files referenced by the pinned snapshot's log, never files merely
  present in the table directory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from common.phase_clock import PhaseClock

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from common.rows import Rows


EngineChoice = Literal["auto", "embedded", "native"]

# Part of the protocol, the same for every engine: the columns ``changes`` adds to each
# row (the kind of change, as in Delta's change data feed, and the commit's version; the
# latter also on ``rows_added``), and the table property that turns the change feed on.
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
CDF_PROPERTY = "delta.enableChangeDataFeed"
CHECKPOINT_INTERVAL_PROPERTY = "delta.checkpointInterval"
# The values of ``CHANGE_TYPE``, as Delta's change data feed spells them: rows a commit
# removed, and rows it added (``changes`` of an append-only range has only INSERT).
INSERT, DELETE = "insert", "delete"
UPDATE_PREIMAGE, UPDATE_POSTIMAGE = "update_preimage", "update_postimage"
REMOVED_CHANGES = (DELETE, UPDATE_PREIMAGE)
ADDED_CHANGES = (INSERT, UPDATE_POSTIMAGE)

PARTITION_OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "not in")


@dataclass(frozen=True)
class AppTransaction:
    """An idempotency token: the pipeline's app id and a strictly increasing version."""

    app_id: str
    version: int

    def __post_init__(self) -> None:
        if not self.app_id:
            raise ValueError("app transaction needs a non-empty app_id")
        if self.version < 0:
            raise ValueError(f"app transaction version must be >= 0, got {self.version}")


@dataclass(frozen=True)
class CommitOutcome:
    """What a write did: the table version it produced, or that it was already there."""

    table_version: int
    committed: bool
    files_added: int = 0
    bytes_added: int = 0
    rows_added: int = 0


@dataclass(frozen=True)
class PartitionFilter:
    """One conjunct ``column <op> value`` over a partition column."""

    column: str
    op: str
    value: Any

    def __post_init__(self) -> None:
        if self.op not in PARTITION_OPERATORS:
            raise ValueError(
                f"partition filter operator must be one of {PARTITION_OPERATORS}, got {self.op!r}"
            )


def describe_filters(where: Sequence[PartitionFilter]) -> str:
    """``where`` as a reader sees it in a log line or an error: ``a = 1 AND b in (...)``."""
    return " AND ".join(f"{f.column} {f.op} {f.value!r}" for f in where)


@dataclass(frozen=True)
class DataFile:
    """One live data file of a snapshot, with its partition values decoded from the log.

    ``bounds`` holds, per column whose log statistics state both, the file's (min, max):
    every non-null value ``v`` of the column in the file has ``min <= v <= max``. Only
    integer, string, date and timestamp columns are given bounds (a float's footer bound
    leaves NaN out); a column without an entry may hold anything.

    ``log_path`` is the path text of the file's add action, as the log stores it (encoded,
    usually relative to the root), where the engine read it from the log: a remove must
    name the file by exactly that text. It is not part of a file's identity (two engines
    that list the same file compare equal whether or not they kept it).
    """

    path: str
    size_bytes: int
    num_records: int | None
    partition_values: Mapping[str, Any] = field(default_factory=dict)
    bounds: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    log_path: str | None = field(default=None, compare=False)

    def may_hold(self, column: str, low: Any, high: Any) -> bool:
        """False only when the log's statistics prove that no value of ``column`` in this
        file lies in ``[low, high]``; True whenever they cannot (no bounds, other types)."""
        bound = self.bounds.get(column)
        if bound is None:
            return True
        file_low, file_high = bound
        try:
            return not (file_high < low or file_low > high)
        except TypeError:  # bounds of another type than the probe: nothing is proven
            return True

    def may_hold_since(self, column: str, oldest: datetime) -> bool:
        """False only when this file provably holds no row with ``column >= oldest``: its
        partition value, or its log statistics, say so; True on any doubt.

        ``oldest`` may be naive (as Spark returns timestamps: local time) or aware; the
        log's values are UTC (the pipeline's sessions run in UTC), naive or aware depending
        on the reader, so both sides are compared as aware UTC datetimes.
        """
        probe = oldest.astimezone(UTC)  # a naive datetime is read as local time
        if column in self.partition_values:
            value = self.partition_values[column]
            if isinstance(value, datetime):
                value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
            try:
                return value is None or not value < probe
            except TypeError:  # a value of another type than the probe: nothing is proven
                return True
        # Bounds are compared as they are typed: one of the two probes matches their kind.
        return self.may_hold(column, probe, datetime.max.replace(tzinfo=UTC)) and self.may_hold(
            column, probe.replace(tzinfo=None), datetime.max
        )


def total_records(files: Iterable[DataFile]) -> int | None:
    """The rows of ``files`` from their log statistics; None when a file has none."""
    counts = [f.num_records for f in files]
    return None if any(c is None for c in counts) else sum(c or 0 for c in counts)


@dataclass(frozen=True)
class Compaction:
    """What one ``compact`` did: files replaced, files written, the version it committed."""

    files_removed: int
    files_added: int
    version: int | None  # None: nothing was small enough to compact, nothing committed


@dataclass(frozen=True)
class Snapshot:
    """A pinned table version: its schema, partitioning and the live files at that version."""

    table_path: str
    version: int
    schema: StructType
    partition_columns: tuple[str, ...]
    files: tuple[DataFile, ...]
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)

    @property
    def num_records(self) -> int | None:
        """Rows in the live files, from their log statistics (rows a deletion vector hides
        included: an upper bound); None when a file has none."""
        return total_records(self.files)


class DeltaEngine(Protocol):
    """Operations the pipeline needs from a Delta table, whatever engine is underneath."""

    name: str
    arrow_in_driver: bool
    """Whether Arrow reads and writes (:meth:`read_arrow`, :meth:`rows_added_arrow`, and
    :meth:`append`, :meth:`overwrite`, :meth:`replace` of Arrow rows) run in the driver
    without a Spark job (the
    embedded engine); otherwise they go through Spark, and a caller that reads or writes
    Arrow only to avoid Spark jobs keeps to its Spark path instead."""
    commit_guard: Callable[[], None] | None
    """Called right before every commit, after the data files are written. If it raises,
    nothing is committed and the error propagates (the lease fencing check goes here)."""
    commit_metadata: Mapping[str, str]
    """Extra entries recorded with every commit (e.g. the run id), for audit."""
    table_properties: Mapping[str, str]
    """Table properties every table this engine creates starts with (a ``create_table``
    call's own ``properties`` win): the warehouse's checkpoint interval, say."""
    clock: PhaseClock | None
    """When set, the time of file writes (``write``) and log commits (``commit``) is charged
    to these phases, for the per-task timings of the run report."""

    def exists(self, path: str) -> bool: ...

    def create_table(
        self,
        path: str,
        schema: StructType,
        partition_by: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> int: ...

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot: ...

    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        """Read ``files`` of ``snapshot`` (all of them by default) as one DataFrame."""
        ...

    def read_arrow(
        self,
        snapshot: Snapshot,
        files: Sequence[DataFile] | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """The rows :meth:`read_files` reads (only ``columns``, in that order, all by
        default) in the driver's memory as Arrow, only those ``where`` holds for (an Arrow
        expression over ``columns``). For data the caller knows is small once filtered; an
        engine that can reads the files without a Spark job, a file at a time."""
        ...

    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame: ...

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
        ...

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
        ...

    def overwrite(
        self, path: str, data: DataFrame | pa.Table, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """Atomically replace the whole table's rows with ``data`` (a Spark frame or Arrow
        rows, as :meth:`append` takes them)."""
        ...

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """Atomically remove the partitions ``where`` selects; no data is read or written."""
        ...

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
        ...

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]: ...

    def commit_infos(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, Mapping[str, Any]]]:
        """Each version of ``(after_version, to_version]`` with its commit information as
        :meth:`history` gives an entry (``commit_metadata`` keys included), oldest first."""
        ...

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
        ...

    def rows_added(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
    ) -> DataFrame:
        """Rows of the files added in ``(after_version, to_version]`` whose rows are still live
        at ``to_version``.

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
        ...

    def count_rows_added(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
    ) -> int | None:
        """How many rows :meth:`rows_added` would return, from the log's record counts with
        no data read; None when the log cannot tell (a file without statistics)."""
        ...

    def rows_by_version(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, int]]:
        """``(version, rows of the data files it added)`` for each version in ``(after, to]``.

        From the log's file statistics alone (no data is read): what a consumer that admits
        input a version at a time needs to size its intake.
        """
        ...

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
        ...

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
        ...

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
        ...

    def transaction_version(self, path: str, app_id: str) -> int | None: ...

    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]: ...

    def compact(self, path: str, target_file_bytes: int) -> Compaction:
        """Rewrite the small files of each partition into files of about the target size,
        in one commit whose actions all have ``dataChange=false``: every version keeps the
        same rows (the replaced files stay on disk until a vacuum, so older versions still
        read), and :meth:`rows_added` and :meth:`changes` see no change in it."""
        ...


# The commitInfo key naming the pipeline operation a commit belongs to, when it is not a
# live step; rows a backfill committed are never new rows of a live batch or stage input.
OPERATION_KEY = "enrichment.operation"
BACKFILL = "backfill"


@contextmanager
def operation(engine: DeltaEngine, name: str) -> Iterator[None]:
    """Tag every commit ``engine`` makes inside the block with ``OPERATION_KEY = name``."""
    before = engine.commit_metadata
    engine.commit_metadata = {**before, OPERATION_KEY: name}
    try:
        yield
    finally:
        engine.commit_metadata = before


def table_rows(
    engine: DeltaEngine, path: str, version: int | None = None, columns: Sequence[str] | None = None
) -> Rows:
    """The rows of ``path`` at ``version`` (the latest when None; only ``columns`` when
    given), read into the driver or as a Spark frame, as the consumer asks."""
    from common.rows import Rows  # here: the protocol's importers need no Spark or Arrow

    snapshot = engine.snapshot(path, version)

    def on_spark() -> DataFrame:
        rows = engine.read(path, version=snapshot.version)
        return rows if columns is None else rows.select(*columns)

    return Rows.read(arrow=lambda: engine.read_arrow(snapshot, columns=columns), spark=on_spark)


def live_rows_added(
    engine: DeltaEngine, path: str, after_version: int, to_version: int, with_version: bool = False
) -> Rows:
    """Rows a live consumer has not seen: added in (after, to], still live, not a backfill's;
    read into the driver or as a Spark frame, as the consumer asks.

    Rows of a file a later commit of the range replaced are left out (the replacing
    backfill re-joined them and published them itself), and so are the files backfill
    commits added. With ``with_version`` each row carries ``_commit_version``.
    """
    from common.rows import Rows  # here: the protocol's importers need no Spark or Arrow

    def on_spark() -> DataFrame:
        skip = _backfill_versions(engine, path, after_version, to_version)
        rows = engine.rows_added(path, after_version, to_version, skip_versions=skip)
        return rows if with_version else rows.drop(COMMIT_VERSION)

    def in_driver() -> pa.Table:
        skip = _backfill_versions(engine, path, after_version, to_version)
        return engine.rows_added_arrow(path, after_version, to_version, skip, with_version)

    return Rows.read(arrow=in_driver, spark=on_spark)


def append_live_rows_added(
    engine: DeltaEngine,
    source: str,
    after_version: int,
    to_version: int,
    target: str,
    txn: AppTransaction,
    partition_by: Sequence[str],
) -> CommitOutcome:
    """Append what :func:`live_rows_added` returns to ``target``: the publish of a batch."""
    skip = _backfill_versions(engine, source, after_version, to_version)
    return engine.append_rows_added(
        source, after_version, to_version, target, txn, skip, partition_by
    )


def rows_committed(engine: DeltaEngine, path: str, after_version: int, to_version: int) -> int:
    """Rows the data files of versions ``(after, to]`` added, from the log alone."""
    return sum(rows for _, rows in engine.rows_by_version(path, after_version, to_version))


def count_live_rows_added(
    engine: DeltaEngine, path: str, after_version: int, to_version: int
) -> int | None:
    """How many rows :func:`live_rows_added` returns, from the log alone (None: unknown)."""
    skip = _backfill_versions(engine, path, after_version, to_version)
    return engine.count_rows_added(path, after_version, to_version, skip_versions=skip)


def _backfill_versions(
    engine: DeltaEngine, path: str, after_version: int, to_version: int
) -> list[int]:
    """The versions in (after, to] that backfills committed."""
    if to_version <= after_version:
        return []
    return [
        version
        for version, info in engine.commit_infos(path, after_version, to_version)
        if info.get(OPERATION_KEY) == BACKFILL
    ]


def history_in_range(
    engine: DeltaEngine, path: str, after_version: int, to_version: int
) -> list[tuple[int, Mapping[str, Any]]]:
    """:meth:`DeltaEngine.commit_infos` from the history: every commit from the latest
    back to ``after_version`` is read, so an engine that can read a version's commit
    information alone does that instead."""
    if to_version <= after_version:
        return []
    latest = engine.snapshot(path).version
    entries = [
        (int(h["version"]), h)
        for h in engine.history(path, limit=latest - after_version)
        if after_version < int(h["version"]) <= to_version
    ]
    return sorted(entries, key=lambda entry: entry[0])
