"""The engine-neutral Delta API's values: snapshots, data files, app transactions, commit
outcomes, partition filters, and the column and property names every engine shares.

The operations on a table are :class:`~warehouse.delta.engine.DeltaEngine`'s; the rows a
live pipeline reads and publishes through them are :mod:`warehouse.delta.live_rows`'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


EngineChoice = Literal["auto", "embedded", "native"]

# Which of a file's rows an Arrow read keeps: a boolean per row of the rows read (their
# asked columns), a null dropping its row as ``Table.filter`` does. A function rather than
# an Arrow expression, so a caller can prepare its test once for every file it reads.
RowMask = Callable[["pa.Table"], "pa.Array | pa.ChunkedArray"]

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


def records_in(files: Iterable[DataFile]) -> int:
    """The rows of ``files`` from their log statistics, a file without them counting none:
    a lower bound, for an estimate that an unknown must not stop."""
    return sum(f.num_records or 0 for f in files)


def total_records(files: Iterable[DataFile]) -> int | None:
    """The rows of ``files`` from their log statistics; None when a file has none."""
    return known_total(f.num_records for f in files)


def known_total(counts: Iterable[int | None]) -> int | None:
    """The sum of ``counts``; None when any is not known."""
    found = list(counts)
    return None if any(c is None for c in found) else sum(c or 0 for c in found)


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


# The commitInfo key naming the pipeline operation a commit belongs to, when it is not a
# live step; rows a backfill committed are never new rows of a live batch or stage input.
OPERATION_KEY = "enrichment.operation"
BACKFILL = "backfill"
