"""Record identity across landing files: which records of a new file bronze already holds.

A stream declares ``id_column``: a record's id names the tuple, whatever file carries it.
A producer that retries re-sends records it already delivered, in a new file whose bytes
differ (file-level SHA-256 cannot see them). Ingest therefore looks each new file's ids up
in bronze before loading it.

Invariants (for ids that are not null; a null id is the required-column check's business):

- an id is loaded into bronze from the first file (lowest ledger id) that carries it;
- a later record with that id and the same content (every declared column null-safe equal)
  is a *re-send*: not loaded, recorded in the ingest quarantine with the reason
  ``re-sent: ...`` naming the file that first loaded it;
- a later record with that id and other content is a *conflict*: not loaded, quarantined
  with the reason ``conflict: ...`` naming that file. Neither version is silently dropped.

Only the ids of files before the one loading count (``_batch_id`` below its ledger id), so
a rerun after a crash that had committed the file classifies it the same way.

Cost stays flat as bronze grows: the lookup reads only the bronze files whose log
statistics (min/max of the id column, :meth:`DataFile.may_hold`) overlap the new file's id
range, and none at all when no file overlaps, the usual case for ids that grow with time.
The range comes from the file's checks in :mod:`warehouse.landing` (the Parquet footer's
statistics, the JSON key check), else from one aggregate over the parsed file.
Ids within one file are not compared with each other here: a suite's uniqueness
expectation on the output (``expect_column_values_to_be_unique``) is what catches them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from warehouse.delta import DeltaEngine

logger = logging.getLogger(__name__)

RESENT = "re-sent: "
CONFLICT = "conflict: "
# Columns the lookup adds to a new file's rows (dropped before anything is written).
KNOWN_FILE, KNOWN_LOW, KNOWN_HIGH = "_known_file", "_known_low", "_known_high"
# A lookup whose candidate files are smaller than this is broadcast to the new file's rows:
# no shuffle of the (usually much larger) new file.
BROADCAST_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class IdRange:
    """The least and greatest non-null id of a file."""

    low: Any
    high: Any


def id_range(parsed: DataFrame, id_column: str) -> IdRange | None:
    """The id range of a parsed file, in one aggregate (for a file whose checks did not
    find it); None when the file has no non-null id."""
    found = parsed.agg(F.min(id_column).alias("low"), F.max(id_column).alias("high")).first()
    if found is None or found["low"] is None:
        return None
    return IdRange(found["low"], found["high"])


@dataclass(frozen=True)
class KnownRecords:
    """Bronze's records that may share an id with the file being loaded."""

    rows: DataFrame
    bytes_read: int
    id_column: str
    file_column: str


def known_records(
    engine: DeltaEngine,
    bronze_path: str,
    id_column: str,
    batch_column: str,
    file_column: str,
    batch: int,
    ids_of: Callable[[], IdRange | None],
) -> KnownRecords | None:
    """Bronze's records from batches before ``batch`` whose id lies in the new file's range
    (``ids_of``, asked only when bronze has files), read from only the files whose
    statistics allow it; None when no file can hold one (nothing is read then)."""
    snapshot = engine.snapshot(bronze_path)
    if not snapshot.files:
        return None
    ids = ids_of()
    if ids is None:
        return None
    candidates = [f for f in snapshot.files if f.may_hold(id_column, ids.low, ids.high)]
    logger.info(
        "id lookup in %s: %d of %d file(s) may hold ids in [%s, %s]",
        bronze_path,
        len(candidates),
        len(snapshot.files),
        ids.low,
        ids.high,
    )
    if not candidates:
        return None
    rows = engine.read_files(snapshot, candidates).where(
        (F.col(batch_column) < F.lit(batch)) & F.col(id_column).between(ids.low, ids.high)
    )
    return KnownRecords(rows, sum(f.size_bytes for f in candidates), id_column, file_column)


def with_known(parsed: DataFrame, known: KnownRecords, columns: list[str]) -> DataFrame:
    """``parsed`` with, per row, what bronze holds under its id: the first file that
    loaded it (``KNOWN_FILE``, null when none) and the least and greatest record there."""
    record = F.struct(*[F.col(c) for c in columns])
    first = known.rows.groupBy(known.id_column).agg(
        F.min(known.file_column).alias(KNOWN_FILE),
        F.min(record).alias(KNOWN_LOW),
        F.max(record).alias(KNOWN_HIGH),
    )
    if known.bytes_read <= BROADCAST_BYTES:
        first = F.broadcast(first)
    return parsed.join(first, on=known.id_column, how="left")


def identity_reason(columns: list[str]) -> tuple[Column, Column]:
    """(is it a re-send, is it a conflict) of a row of :func:`with_known`'s frame."""
    record = F.struct(*[F.col(c) for c in columns])
    seen = F.col(KNOWN_FILE).isNotNull()
    same = record.eqNullSafe(F.col(KNOWN_LOW)) & record.eqNullSafe(F.col(KNOWN_HIGH))
    return seen & same, seen & ~same


def resent_message(id_column: str) -> Column:
    return _message(
        RESENT, id_column, "was already loaded from", "with the same content; not loaded again"
    )


def conflict_message(id_column: str) -> Column:
    return _message(
        CONFLICT, id_column, "was loaded from", "with other content; this record is not loaded"
    )


def _message(kind: str, id_column: str, loaded: str, outcome: str) -> Column:
    """``<kind><id column> <id> <loaded> <first file> <outcome>``, per row."""
    return F.concat(
        F.lit(f"{kind}{id_column} "),
        F.col(id_column).cast("string"),
        F.lit(f" {loaded} "),
        F.col(KNOWN_FILE),
        F.lit(f" {outcome}"),
    )
