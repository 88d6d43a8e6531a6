"""Loading admitted landing files into a stream's bronze Delta table, each once.

Files load in ledger order under the app transaction ``ingest.<stream>`` at their ledger
id. Consecutive Parquet files whose ids (from their footers) do not overlap share one scan
and one commit, at the last one's ledger id, so that many small files cost one Spark job;
each keeps its ledger row, counts and quarantine append. A crash leaves files
``registered``; the next run resumes them, and a file of a shared commit is found in bronze
by its ledger id and counted, not written again. The whole contract:
``docs/reliability.md``, "The landing zone's contract".

Also here, what one ingest of a stream did: its counts (:class:`IngestReport`) and the log
of its problems (:class:`IngestLog`), kept by admission (:mod:`warehouse.landing`) and the
load alike.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import IngestionError, LedgerOrderError
from warehouse.delta import AppTransaction, CommitOutcome, DeltaEngine
from warehouse.delta.schema import spark_to_arrow
from warehouse.landing_parse import (
    ParsedFile,
    StreamSource,
    count_records,
    parse_staged,
    read_parquet,
    split_records,
    unreadable,
)
from warehouse.landing_zone import StagedCopy
from warehouse.record_identity import IdRange, KnownRecords, id_range, known_records
from warehouse.state_store import StateStore
from warehouse.state_tables import LOADED, REJECTED, LandingFile

logger = logging.getLogger("warehouse.landing")


@dataclass
class IngestReport:
    """What one ingest of a stream did, in counts."""

    stream: str
    files_loaded: int = 0
    files_skipped: int = 0
    files_rejected: int = 0
    files_missing: int = 0
    # Rejected files still in the landing directory after this run, old and new.
    files_rejected_in_place: int = 0
    records_received: int = 0
    records_loaded: int = 0
    records_quarantined: int = 0
    # Records whose id an earlier file loaded with the same content (not loaded again); a
    # re-sent id with other content is counted as quarantined.
    records_resent: int = 0
    errors: list[str] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        """Every count, under its field's name (the metrics table's)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}


class IngestLog:
    """An ingest's report and the problems it reports: each rejected file once a run, every
    error logged and kept for the run's exit code."""

    def __init__(self, store: StateStore, report: IngestReport) -> None:
        self.store, self.report = store, report
        self.reported: set[str] = set()  # paths whose problem this run already reported

    def reject(self, row: LandingFile, message: str) -> None:
        self.store.update_landing_file(
            row.id, status=REJECTED, error=message, finished_at=datetime.now(UTC)
        )
        self.rejected(row.path, message)

    def rejected(self, path: str, message: str) -> None:
        self.report.files_rejected += 1
        self.reported.add(path)
        self.report_error(message)

    def report_error(self, message: str) -> None:
        logger.error("%s", message)
        self.report.errors.append(message)


SOURCE_FILE = "_source_file"
BATCH_ID = "_batch_id"
STAGED_NAME = "_staged_name"  # a group scan's column: the staged copy a row was read from
GROUP_FILES = 256
"""Files at most in one bronze commit (:meth:`BronzeLoad._load_group`)."""
DRIVER_GROUP_BYTES = 64 * 1024**2
"""A group of clean Parquet files up to this size is read in the driver, not by Spark."""


def _disjoint(parsed: ParsedFile, group: list[tuple[LandingFile, StagedCopy, ParsedFile]]) -> bool:
    """``parsed``'s ids overlap no file's of ``group`` (no ids at all: nothing to overlap)."""
    ids = parsed.ids
    if ids is None:
        return True
    for _, _, other in group:
        if other.ids is not None and not (ids.high < other.ids.low or ids.low > other.ids.high):
            return False
    return True


def _staged_names(
    group: list[tuple[LandingFile, StagedCopy, ParsedFile]],
) -> dict[str, LandingFile]:
    """The group's ledger rows by their staged copy's file name (what a scan's
    ``_metadata.file_name`` gives; a name twice would keep one row)."""
    return {staged.url.rstrip("/").rsplit("/", 1)[-1]: row for row, staged, _ in group}


class BronzeLoad:
    """The load half of one ingest: staged files to bronze, in ledger order."""

    def __init__(
        self, spark: SparkSession, engine: DeltaEngine, source: StreamSource, log: IngestLog
    ) -> None:
        """``log``: the ingest's report, and its state store, whose ledger rows the load
        marks loaded."""
        self.spark, self.engine, self.source, self.log = spark, engine, source, log
        # The highest ledger id committed to bronze; commits must only ever go up from it.
        self.committed = engine.transaction_version(source.bronze_path, self._app) or 0

    @property
    def _app(self) -> str:
        return f"ingest.{self.source.name}"

    def load_all(self, pending: list[tuple[LandingFile, StagedCopy]]) -> None:
        """Load the staged files in ledger order. Consecutive files that can share one
        bronze commit do (:meth:`_load_group`); any other file commits on its own."""
        group: list[tuple[LandingFile, StagedCopy, ParsedFile]] = []
        for row, staged in pending:
            if row.id <= self.committed:  # held back, or resumed after a crash
                self._load_group(group)
                group = []
                self._load(row, staged)
                continue
            parsed = self._parse(row, staged)
            if parsed is None:  # rejected
                continue
            if not self._groupable(parsed):
                self._load_group(group)
                group = []
                self._load(row, staged, parsed)
                continue
            if not _disjoint(parsed, group) or len(group) >= GROUP_FILES:
                self._load_group(group)
                group = []
            group.append((row, staged, parsed))
        self._load_group(group)

    def _groupable(self, parsed: ParsedFile) -> bool:
        """A file may share a commit when its ids are known from its checks (a Parquet
        footer's statistics) or the stream has no ids: then its re-sent records are found
        against bronze alone, given the group's files hold no id in common."""
        return self.source.format == "parquet" and (
            self.source.id_column is None or (parsed.ids_checked and parsed.ids is not None)
        )

    def _load_group(self, group: list[tuple[LandingFile, StagedCopy, ParsedFile]]) -> None:
        """Load files of disjoint ids (one or more) in one bronze commit, under the app
        transaction of the group's last ledger id: the commit lands all of them or none,
        and a rerun after it finds each file's rows in bronze (:meth:`_in_bronze`). Each
        file keeps its own ledger row and quarantine append.

        A group whose every record is valid on its footers' word (no null in a required
        column, no id bronze may hold: nothing to split) is read by pyarrow in the driver
        and appended as it is (:meth:`_group_rows`), without a Spark job. Any other group
        is one Spark scan whose observation counts it as the write passes; each file's
        counts come from its footer when nothing was held back, else from a count of its
        own. A group whose Spark write fails on a file Spark cannot read is loaded file by
        file, so that only that file is rejected."""
        if not group:
            return
        if len(_staged_names(group)) < len(group):
            for row, staged, parsed in group:
                self._load(row, staged, parsed)
            return
        known = self._group_known(group)
        rows = self._group_rows(group) if known is None else None
        counts = Observation(f"ingest.{self.source.name}.{group[0][0].id}-{uuid.uuid4().hex[:8]}")
        last = group[-1][0]
        txn = AppTransaction(self._app, last.id)
        try:
            if rows is not None:
                outcome = self.engine.append(self.source.bronze_path, rows, txn)
            else:
                valid = self._group_valid(group, counts, known)
                outcome = self.engine.append(self.source.bronze_path, valid, txn)
        except Py4JJavaError as e:
            logger.warning(
                "ingest %s: %d files in one commit failed (%s); loading them one by one",
                self.source.name,
                len(group),
                str(e).splitlines()[0][:200],
            )
            for row, staged, parsed in group:
                self._load(row, staged, parsed)
            return
        logger.info(
            "ingest %s: %d file(s) (ledger ids %d-%d) in one bronze commit%s",
            self.source.name,
            len(group),
            group[0][0].id,
            last.id,
            " (read in the driver)" if rows is not None else "",
        )
        clean = rows is not None or self._observed_clean(group, counts, outcome)
        for row, staged, parsed in group:
            try:
                if clean:
                    received, bad, resent = int(parsed.rows or 0), 0, 0
                else:  # records held back somewhere in the group: each file counts its own
                    received, bad, resent = count_records(parsed.frame, self.source, known)
                    self._quarantine(row, parsed.frame, known, bad)
            finally:
                staged.delete()
            self._finish(row, received, bad, resent)

    @staticmethod
    def _observed_clean(
        group: list[tuple[LandingFile, StagedCopy, ParsedFile]],
        counts: Observation,
        outcome: CommitOutcome,
    ) -> bool:
        """Whether the group's Spark write passed every record of the footers and held
        none back (so each file's counts are its footer's row count)."""
        if not outcome.committed or any(parsed.rows is None for _, _, parsed in group):
            return False
        observed = counts.get
        footers = sum(parsed.rows or 0 for _, _, parsed in group)
        return not observed.get("bad") and observed.get("received") == footers

    def _group_rows(
        self, group: list[tuple[LandingFile, StagedCopy, ParsedFile]]
    ) -> pa.Table | None:
        """The group's records as bronze rows, read by pyarrow in the driver, when each is
        valid by its footer (no null in a required column) and the group is small enough
        to hold (:data:`DRIVER_GROUP_BYTES`); else None. Types were checked against the
        declaration with the footers, so the columns only take the declared types."""
        if sum(staged.size_bytes for _, staged, _ in group) > DRIVER_GROUP_BYTES:
            return None
        if any(parsed.required_nulls != 0 for _, _, parsed in group):
            return None
        names = self.source.schema.fieldNames()
        declared = spark_to_arrow(self.source.schema)
        tables = []
        for row, staged, _ in group:
            try:
                with staged.open() as handle:
                    table = pq.read_table(handle, columns=names).select(names).cast(declared)
            except (pa.ArrowException, OSError) as e:
                # A footer that reads over pages that do not: Spark's load finds the file
                # and rejects it alone (``_load_group``'s fallback).
                logger.info(
                    "ingest %s: %s does not read in the driver (%s)", self.source.name, row.path, e
                )
                return None
            n = table.num_rows
            table = table.append_column(SOURCE_FILE, pa.repeat(pa.scalar(row.path), n))
            tables.append(
                table.append_column(BATCH_ID, pa.repeat(pa.scalar(row.id, pa.int64()), n))
            )
        return pa.concat_tables(tables)

    def _group_valid(
        self,
        group: list[tuple[LandingFile, StagedCopy, ParsedFile]],
        counts: Observation,
        known: KnownRecords | None,
    ) -> DataFrame:
        """The group's valid records, read in one scan, each stamped with its landing file's
        path and ledger id (found by its staged copy's name, unique per file); ``counts``
        observes the whole group as the write passes it."""
        by_name = _staged_names(group)
        urls = [staged.url for _, staged, _ in group]
        frame = read_parquet(self.spark, self.source, urls).withColumn(
            STAGED_NAME, F.col("_metadata.file_name")
        )
        valid, _ = split_records(
            frame, self.source.schema, self.source.required, counts, known, keep=(STAGED_NAME,)
        )
        paths = F.create_map(*[F.lit(x) for n, r in by_name.items() for x in (n, r.path)])
        ids = F.create_map(*[F.lit(x) for n, r in by_name.items() for x in (n, r.id)])
        name = F.col(STAGED_NAME)
        return valid.select(
            *self.source.schema.fieldNames(),
            F.element_at(paths, name).alias(SOURCE_FILE),
            F.element_at(ids, name).cast(T.LongType()).alias(BATCH_ID),
        )

    def _group_known(
        self, group: list[tuple[LandingFile, StagedCopy, ParsedFile]]
    ) -> KnownRecords | None:
        """What bronze held before the group under any id of its files (their footers'
        ranges; the files hold no id in common, so none re-sends another's records)."""
        id_column = self.source.id_column
        if id_column is None or self.committed == 0:
            return None
        ranges = [parsed.ids for _, _, parsed in group if parsed.ids is not None]
        if not ranges:
            return None
        return self._bronze_known(
            id_column,
            group[0][0].id,
            lambda: IdRange(min(r.low for r in ranges), max(r.high for r in ranges)),
        )

    def _bronze_known(
        self, id_column: str, batch: int, ids: Callable[[], IdRange | None]
    ) -> KnownRecords | None:
        """Bronze's records from batches before ``batch`` under the ids ``ids`` gives."""
        return known_records(
            self.engine, self.source.bronze_path, id_column, BATCH_ID, SOURCE_FILE, batch, ids
        )

    def _in_bronze(self, row: LandingFile) -> bool:
        """Does bronze hold rows of ``row``'s ledger id? Asked of a file registered below
        the committed id: loaded by a group commit before a crash kept its ledger row from
        being marked, or held back (then it holds none)."""
        snapshot = self.engine.snapshot(self.source.bronze_path)
        candidates = [f for f in snapshot.files if f.may_hold(BATCH_ID, row.id, row.id)]
        if not candidates:
            return False
        rows = self.engine.read_files(snapshot, candidates)
        return bool(rows.where(F.col(BATCH_ID) == F.lit(row.id)).limit(1).count())

    def _load(
        self, row: LandingFile, staged: StagedCopy, parsed_file: ParsedFile | None = None
    ) -> None:
        """Load one staged file: its valid records to bronze, its malformed ones to the
        ingest quarantine, and the ledger row marked loaded.

        One Spark job reads, checks and writes the file: the records received and the
        malformed ones are counted by an observation as the bronze write passes them
        (``DataFrame.observe``). Only a file with malformed records is read a second time,
        for its quarantine append.
        """
        path = row.path
        try:
            if parsed_file is None and row.id < self.committed and self._in_bronze(row):
                # A group commit took it before a crash: counted again, not written.
                parsed_file = parse_staged(self.spark, self.source, staged, path)
                known = self._known(row, parsed_file)
                received, bad, resent = count_records(parsed_file.frame, self.source, known)
                self._quarantine(row, parsed_file.frame, known, bad)
                staged.delete()
                self._finish(row, received, bad, resent)
                return
            if parsed_file is None:
                parsed_file = self._parse(row, staged)
            if parsed_file is None:
                return
            parsed = parsed_file.frame
            valid, counts, known = self._observed_valid(row, parsed_file)
            try:
                outcome = self.engine.append(
                    self.source.bronze_path, valid, AppTransaction(self._app, row.id)
                )
            except Py4JJavaError as e:
                self.log.reject(row, str(unreadable(e, self.source, path)))
                return
            received, bad, resent = self._counted(outcome, counts, parsed, known)
            self._quarantine(row, parsed, known, bad)
        finally:
            staged.delete()
        self._finish(row, received, bad, resent)

    def _observed_valid(
        self, row: LandingFile, parsed: ParsedFile
    ) -> tuple[DataFrame, Observation, KnownRecords | None]:
        """A file's valid records stamped with its path and ledger id, for its bronze write;
        the observation that counts its records as that write passes them; and what bronze
        already holds under its ids."""
        counts = Observation(f"ingest.{self.source.name}.{row.id}.{uuid.uuid4().hex[:8]}")
        known = self._known(row, parsed)
        valid, _ = split_records(
            parsed.frame, self.source.schema, self.source.required, counts, known
        )
        return self._stamped(valid, row), counts, known

    def _counted(
        self,
        outcome: CommitOutcome,
        counts: Observation,
        parsed: DataFrame,
        known: KnownRecords | None,
    ) -> tuple[int, int, int]:
        """(records, records not loaded, re-sent records) of a file after its bronze write:
        observed by the write, or, when bronze already held it (a crash after its commit:
        no write job ran, nothing was observed), counted again."""
        if not outcome.committed:
            return count_records(parsed, self.source, known)
        observed = counts.get
        return (
            int(observed["received"]),
            int(observed["bad"] or 0),
            int(observed["resent"] or 0),
        )

    def _quarantine(
        self, row: LandingFile, parsed: DataFrame, known: KnownRecords | None, bad: int
    ) -> None:
        """A file's malformed records to the ingest quarantine (a clean file commits nothing
        here: the bronze commit's app transaction alone marks it loaded, so a rerun has
        nothing to repeat either way)."""
        if not bad:
            return
        _, malformed = split_records(parsed, self.source.schema, self.source.required, known=known)
        self.engine.append(
            self.source.quarantine_path,
            self._quarantined(malformed, row),
            AppTransaction(f"quarantine.{self.source.name}", row.id),
        )

    def _finish(self, row: LandingFile, received: int, bad: int, resent: int) -> None:
        """The ledger row marked loaded, the report counted, the file logged."""
        path = row.path
        self.committed = max(self.committed, row.id)
        self.log.store.update_landing_file(
            row.id,
            status=LOADED,
            records_received=received,
            records_loaded=received - bad,
            records_quarantined=bad - resent,
            records_resent=resent,
            finished_at=datetime.now(UTC),
        )
        self.log.report.files_loaded += 1
        self.log.report.records_received += received
        self.log.report.records_loaded += received - bad
        self.log.report.records_quarantined += bad - resent
        self.log.report.records_resent += resent
        logger.info(
            "loaded %s: %d record(s), %d quarantined, %d re-sent",
            path,
            received,
            bad - resent,
            resent,
        )
        if resent:
            logger.warning(
                "%s: %d record(s) re-sent: an earlier file loaded their %s with the same "
                "content; not loaded again, recorded in %s",
                path,
                resent,
                self.source.id_column,
                self.source.quarantine_path,
            )

    def _known(self, row: LandingFile, parsed: ParsedFile) -> KnownRecords | None:
        """What bronze already holds under the new file's ids (none: nothing to look up)."""
        id_column = self.source.id_column
        if id_column is None or self.committed == 0:
            return None

        def ids() -> IdRange | None:
            if parsed.ids_checked:
                return parsed.ids
            return id_range(parsed.frame, id_column)

        return self._bronze_known(id_column, row.id, ids)

    def _stamped(self, valid: DataFrame, row: LandingFile) -> DataFrame:
        return valid.withColumn(SOURCE_FILE, F.lit(row.path)).withColumn(
            BATCH_ID, F.lit(row.id).cast(T.LongType())
        )

    def _quarantined(self, malformed: DataFrame, row: LandingFile) -> DataFrame:
        return malformed.select(
            F.lit(self.source.name).alias("stream"),
            F.lit(row.path).alias("source_file"),
            F.col("record"),
            F.col("reason"),
            F.lit(row.id).cast(T.LongType()).alias(BATCH_ID),
            F.current_timestamp().alias("quarantined_at"),
        )

    def _parse(self, row: LandingFile, staged: StagedCopy) -> ParsedFile | None:
        """Check a staged file and read it (lazily); reject it (and return None) if it is bad."""
        path = row.path
        try:
            if row.id < self.committed:
                raise LedgerOrderError(
                    f"{path}: cannot be committed under its ledger id {row.id}: bronze already "
                    f"records the later batch {self.committed}, and Delta would skip this "
                    "commit as done. Nothing of it is loaded; it was held back (changed or "
                    "unreadable) while later files loaded. If bronze holds no rows with "
                    f"{BATCH_ID} {row.id}, deliver it again under a new name."
                )
            return parse_staged(self.spark, self.source, staged, path)
        except IngestionError as e:
            self.log.reject(row, str(e))
            return None
