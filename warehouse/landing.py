"""Landing-zone ingestion: complete micro-batch files into a stream's bronze Delta table.

A stream's landing zone is a local directory or a prefix ``s3://bucket/prefix`` of an
S3-compatible object store. Both keep one contract; where they differ (how a zone is listed,
read and staged) lives behind :class:`~warehouse.landing_zone.LandingZone`
(:mod:`warehouse.landing_local`, :mod:`warehouse.landing_s3`), how a staged file is checked
and parsed in :mod:`warehouse.landing_parse`.

Contract:

- Producers place files atomically. Names starting with ``_`` or ``.`` are in progress and
  ignored (``_staging`` is this module's own directory), as are directories; files in
  subdirectories (key prefixes below the zone's, in an object store) are read. In an object
  store a PUT is atomic and an unfinished multipart upload is no object, so producers need
  no temporary names there.
- Only regular files inside a landing directory are read. A symlink (to a file or a
  directory, even one inside the zone), a FIFO, socket or device, or a path that resolves
  outside the landing directory is refused: never opened, recorded ``rejected`` with the
  reason, left in place. Files are opened with ``O_NOFOLLOW``. None of this applies to an
  object store, which has no symlinks, special files or paths that resolve elsewhere: every
  object listed below the prefix is read.
- The landing directory's path (or object-store location) must not contain a glob character
  (``* ? [ ] { } \\``): Spark expands them in every path it reads. Such a stream fails with
  :class:`ConfigError`.
- Each file is registered in the state store's ledger once, by (stream, path) with its size
  and SHA-256 (the path of an object is its ``s3://bucket/key``). The pass that hashes a
  file that is to load also copies it to ``<landing>/_staging/<ledger id>.<format>`` (in
  an object store, uploads it as ``<prefix>/_staging/<random hex>.<format>``) and, for CSV
  and JSON, checks that it is UTF-8. Spark reads only that copy: exactly the bytes whose
  hash the ledger holds, under a name made of ``[0-9a-z._/-]`` below the landing zone, which
  no glob can widen. The copy is deleted once the file is loaded or rejected; copies left
  by a killed run are deleted by the next. Ingestion therefore needs write access to the
  landing directory (to ``<prefix>/_staging/`` in an object store).
- A re-delivered identical file is skipped with a log line. Different content under the
  name of a file that is loaded or in flight is reported as an error on every run and
  nothing of it is loaded; deliver corrections under a new name.
- Every file still in a local landing directory is read and hashed on every run, the loaded
  ones too: that is how changed content is noticed. In an object store the ledger also keeps
  the ETag of the bytes it hashed (the GET's), and an object listed with that ETag and size
  at its key is the same content without a GET: a loaded or duplicate one is skipped, a
  rejected one stays rejected, as if it had been read. Any other ETag or size is read and
  hashed as in a directory; a row without an ETag (recorded before the ledger kept them) is
  read once more and gets the ETag of the bytes that hashed the same.
- A file whose SHA-256 equals that of a file of the same stream that is loaded or in flight
  is not loaded again: ledger status ``duplicate``, the error names the original, a
  warning is logged, and it counts as skipped.
- Files are loaded in ledger order, one bronze commit per file, with the app transaction
  ``ingest.<stream>`` at the file's ledger id; consecutive Parquet files whose ids (from
  their footers) do not overlap share one commit, at the last one's ledger id, so that many
  small files cost one Spark job. A crash anywhere leaves the files ``registered``; the
  next run resumes them and the transaction id makes the commit land once (a file of a
  shared commit is found in bronze by its ledger id, and counted, not written again).
  Delta keeps only the highest version of an app transaction, so a file is committed only
  while no later ledger id has been: a file held back past that point (its content changed
  while in flight and later came back) is rejected with the reason, never skipped as
  "already committed".
- Records that do not parse against the declared schema, or have nulls in required
  columns, go to the quarantine table with the raw record, the reason and the source file.
- A stream with an ``id_column`` loads each id once: a record whose id an earlier file
  loaded is not loaded again. With the same content it is counted as re-sent (ledger
  ``records_resent``) and recorded in the quarantine table with a ``re-sent:`` reason naming
  the file that first loaded it; with other content it is quarantined as a ``conflict:``.
  See :mod:`warehouse.record_identity` (ids repeated within one file are not compared).
- A bad file is rejected whole (ledger status ``rejected``, error recorded), stays where it
  is, and every other file proceeds: columns that differ from the declaration, CSV or JSON
  that is not UTF-8 (the error gives the byte offset), a Parquet file that cannot be read,
  a refused entry (see above).
- Every ingest reports every rejected file still in the landing directory (its message goes
  into :attr:`IngestReport.errors`, so the run exits 4) until it is moved away. Nothing of a
  rejected or duplicate file was ever committed, so new content under its name is a new
  delivery: it is registered again, under a new ledger id, and loaded.
- A registered file that vanishes before it is loaded is marked ``missing`` and reported
  once; a file delivered again under its name is a new delivery. If bronze may already hold
  part of it (a crash after its bronze commit), it stays ``registered`` and is reported on
  every run until the same file is restored under the same name, which resumes it.
- A refused entry or changed content at the name of a loaded or in-flight file is reported
  on every run; the ledger keeps its entry for the file that was there before.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import IngestionError, LedgerOrderError, RefusedFileError, UnreadableFileError
from warehouse.delta import AppTransaction, CommitOutcome, DeltaEngine
from warehouse.landing_location import rejected_in_place, zone_for
from warehouse.landing_parse import (
    FORMAT_NAMES,
    ParsedFile,
    StreamSource,
    count_records,
    parse_staged,
    read_parquet,
    split_records,
    unreadable,
)
from warehouse.landing_zone import FileRead, LandingEntry, LandingZone, StagedCopy, refused
from warehouse.record_identity import IdRange, KnownRecords, id_range, known_records
from warehouse.state_landing import rejected_files_in_place
from warehouse.state_store import StateStore
from warehouse.state_tables import DUPLICATE, LOADED, MISSING, REGISTERED, REJECTED, LandingFile

# Exported as before; rejected_files_in_place answers for a local zone only (ingestion asks
# its zone: landing_location.rejected_in_place).
__all__ = ["IngestReport", "StreamSource", "ingest_stream", "rejected_files_in_place"]

logger = logging.getLogger(__name__)

SOURCE_FILE = "_source_file"
BATCH_ID = "_batch_id"
STAGED_NAME = "_staged_name"  # a group scan's column: the staged copy a row was read from
TEXT_FORMATS = frozenset({"csv", "json"})
GROUP_FILES = 256
"""Files at most in one bronze commit (:meth:`_StreamIngest._load_group`)."""

# A new file is a duplicate if its content is that of a file of these statuses.
DUPLICATE_OF = (REGISTERED, LOADED)
# Files whose same content is decided without its bytes (nothing is staged or loaded), so
# an object listed with their recorded ETag and size is not read: skipped or still rejected.
KNOWN_BY_ETAG = (LOADED, DUPLICATE, REJECTED)


@dataclass
class IngestReport:
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
        return {
            "files_loaded": self.files_loaded,
            "files_skipped": self.files_skipped,
            "files_rejected": self.files_rejected,
            "files_missing": self.files_missing,
            "files_rejected_in_place": self.files_rejected_in_place,
            "records_received": self.records_received,
            "records_loaded": self.records_loaded,
            "records_quarantined": self.records_quarantined,
            "records_resent": self.records_resent,
        }


def ingest_stream(
    spark: SparkSession,
    engine: DeltaEngine,
    store: StateStore,
    source: StreamSource,
    run_id: str,
    zone: LandingZone | None = None,
) -> IngestReport:
    """Load every new complete file of one stream; see the module docstring for guarantees.

    ``zone``: where the files are; by default the zone at ``source.landing_dir``
    (:func:`~warehouse.landing_location.zone_for`)."""
    zone = zone if zone is not None else zone_for(source.landing_dir, source.format)
    zone.check_location(source.name)
    engine.create_table(source.bronze_path, source.bronze_schema)
    engine.create_table(source.quarantine_path, source.quarantine_schema)
    return _StreamIngest(spark, engine, store, source, run_id, zone).run()


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


def _now() -> datetime:
    return datetime.now(UTC)


def _listed_as_known(entry: LandingEntry, known: LandingFile) -> bool:
    """Whether the listing shows the content the ledger hashed: the ETag recorded with its
    SHA-256 (compared exactly, as the server gives it) and the same size."""
    return (
        entry.etag is not None
        and known.sha256 != ""  # never read (refused): no content to be the same as
        and (entry.etag, entry.size_bytes) == (known.etag, known.size_bytes)
    )


class _StreamIngest:
    """One ingest of one stream: admit what the landing zone holds, then load it."""

    def __init__(
        self,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        source: StreamSource,
        run_id: str,
        zone: LandingZone,
    ) -> None:
        self.spark, self.engine, self.store = spark, engine, store
        self.source, self.run_id, self.zone = source, run_id, zone
        self.report = IngestReport(source.name)
        self.text = source.format in TEXT_FORMATS
        # The highest ledger id committed to bronze; commits must only ever go up from it.
        self.committed = engine.transaction_version(source.bronze_path, self._app) or 0
        self.reported: set[str] = set()  # paths whose problem this run already reported
        # Files registered by earlier runs and not loaded yet; those not found are missing.
        self.in_flight = {row.path: row for row in store.landing_files(source.name, REGISTERED)}

    @property
    def _app(self) -> str:
        return f"ingest.{self.source.name}"

    def run(self) -> IngestReport:
        entries, unlisted = self.zone.scan()
        for directory, reason in unlisted.items():
            self._error(
                f"{directory}: cannot be listed ({reason}); files below it are not ingested, "
                "or looked for, until it can be"
            )
        pending: list[tuple[LandingFile, StagedCopy]] = []
        try:
            for entry in entries:
                admitted = self._admit(entry)
                if admitted is not None:
                    pending.append(admitted)
            self._look_for_in_flight(unlisted)
            self._load_all(sorted(pending, key=lambda item: item[0].id))
        finally:
            for _, staged in pending:
                staged.delete()
        self._remind_rejected()
        self._log_summary()
        return self.report

    # ------------------------------------------------------------------ admission

    def _admit(self, entry: LandingEntry) -> tuple[LandingFile, StagedCopy] | None:
        """Register or skip one entry; return the ledger row and staged copy to load, if any."""
        known = self.store.landing_file(self.source.name, entry.path)
        if entry.refusal is not None:
            self.in_flight.pop(entry.path, None)
            self._refuse(entry, known, refused(entry.path, entry.refusal))
            return None
        temps: list[StagedCopy] = []
        admitted = None
        try:
            admitted = self._admit_read(entry, known, temps)
            return admitted
        finally:
            kept = admitted[1].url if admitted is not None else None
            for temp in temps:
                if temp.url != kept:  # a local copy placed for loading has moved already
                    temp.delete()

    def _admit_read(
        self, entry: LandingEntry, known: LandingFile | None, temps: list[StagedCopy]
    ) -> tuple[LandingFile, StagedCopy] | None:
        """Read an entry that is not refused (its copies into ``temps``) and decide."""
        path = entry.path
        if known is not None and known.status in KNOWN_BY_ETAG and _listed_as_known(entry, known):
            self._same_again(entry, known)  # the ledger's ETag and size: not read
            return None
        # Loaded and duplicate files are only hashed, to notice new content; anything
        # that may load is copied in the same pass, so the copy is what was hashed.
        copy = known is None or known.status not in (LOADED, DUPLICATE)
        read = self._read(entry, known, temps, copy)
        if read is None:
            return None
        same = known is not None and (known.sha256, known.size_bytes) == (
            read.sha256,
            read.size_bytes,
        )
        if known is not None and same and read.etag is not None and read.etag != known.etag:
            # The ETag of bytes that hash as recorded (a row from before the ledger kept
            # ETags, or a new PUT of the same bytes): the next run need not read them.
            self.store.update_landing_file(known.id, etag=read.etag)
        if known is not None and known.status in (LOADED, REGISTERED):
            if not same:
                self._changed(entry, known, read)
                return None
            if known.status == LOADED:
                self._skip(entry, known)
                return None
            if read.bad_utf8_at is not None:
                self._reject(known, self._not_utf8(entry, read))
                return None
            logger.info("resume %s (ledger id %d)", path, known.id)
            return known, self.zone.place(temps[-1], known.id)
        if known is not None and same and known.status in KNOWN_BY_ETAG:
            self._same_again(entry, known)
            return None
        if not copy:  # a duplicate's name now holds new content: read it again, copying
            read = self._read(entry, known, temps, copy=True)
            if read is None:
                return None
        return self._register(entry, known, read, temps[-1])

    def _same_again(self, entry: LandingEntry, known: LandingFile) -> None:
        """The content the ledger knows, at the name of a loaded, duplicate or rejected file."""
        if known.status == REJECTED:
            return  # still rejected; _remind_rejected reports it
        self._skip(entry, known)

    def _read(
        self, entry: LandingEntry, known: LandingFile | None, temps: list[StagedCopy], copy: bool
    ) -> FileRead | None:
        try:
            read = self.zone.read(entry.path, stage=copy, check_utf8=self.text and copy)
        except FileNotFoundError:
            # Gone since the scan: if it was in flight, it is missing (unless it reappears).
            logger.info("%s vanished while it was being read", entry.path)
            return None
        except (RefusedFileError, UnreadableFileError) as e:
            self.in_flight.pop(entry.path, None)
            self._refuse(entry, known, str(e))
            return None
        if read.staged is not None:
            temps.append(read.staged)
        self.in_flight.pop(entry.path, None)
        return read

    def _register(
        self, entry: LandingEntry, known: LandingFile | None, read: FileRead, temp: StagedCopy
    ) -> tuple[LandingFile, StagedCopy] | None:
        """Register a new delivery: a new name, or new content under a never-loaded name."""
        path = entry.path
        original = self.store.landing_file_with_digest(self.source.name, read.sha256, DUPLICATE_OF)
        status, error = REGISTERED, None
        if original is not None:
            status = DUPLICATE
            error = (
                f"{path}: same content as {original.path} (ledger id {original.id}, "
                f"{original.status}; sha256 {read.sha256[:12]}…); not loaded again"
            )
        elif read.bad_utf8_at is not None:
            status, error = REJECTED, self._not_utf8(entry, read)
        if known is None:
            row = self.store.register_landing_file(
                self.source.name,
                path,
                read.size_bytes,
                read.sha256,
                self.run_id,
                status=status,
                error=error,
                etag=read.etag,
            )
        else:
            logger.info(
                "%s has new content since it was %s (ledger id %d); registering it again",
                path,
                known.status,
                known.id,
            )
            row = self.store.reregister_landing_file(
                known.id,
                read.size_bytes,
                read.sha256,
                self.run_id,
                status=status,
                error=error,
                etag=read.etag,
            )
        if status == DUPLICATE:
            logger.warning("%s", error)
            self.report.files_skipped += 1
            return None
        if status == REJECTED:
            self._rejected(row.path, error or "")
            return None
        return row, self.zone.place(temp, row.id)

    def _skip(self, entry: LandingEntry, known: LandingFile) -> None:
        logger.info("skip %s: already %s (ledger id %d)", entry.path, known.status, known.id)
        self.report.files_skipped += 1

    def _changed(self, entry: LandingEntry, known: LandingFile, read: FileRead) -> None:
        self._error(
            f"{entry.path}: content changed since it was registered on "
            f"{known.registered_at:%Y-%m-%d %H:%M:%S} (sha256 {known.sha256[:12]}…, "
            f"{known.size_bytes} bytes; now {read.sha256[:12]}…, {read.size_bytes} bytes). "
            "Deliver corrections under a new file name."
        )

    def _not_utf8(self, entry: LandingEntry, read: FileRead) -> str:
        return (
            f"{entry.path}: is not valid UTF-8: byte {read.bad_utf8_at} does not decode; "
            f"expected a UTF-8 {FORMAT_NAMES[self.source.format]} file. The file is left in "
            "place; fix the producer's encoding."
        )

    def _refuse(self, entry: LandingEntry, known: LandingFile | None, message: str) -> None:
        """Record an entry that is never read; the ledger keeps what it knows of loaded files."""
        if known is None:
            row = self.store.register_landing_file(
                self.source.name,
                str(entry.path),
                entry.size_bytes,
                "",  # never read, so no hash: any regular file here later is new content
                self.run_id,
                status=REJECTED,
                error=message,
            )
            self._rejected(row.path, message)
        elif known.status in (REJECTED, DUPLICATE, MISSING):
            if (known.status, known.error, known.sha256) != (REJECTED, message, ""):
                self.store.update_landing_file(
                    known.id,
                    status=REJECTED,
                    sha256="",
                    etag=None,  # no content known: whatever is listed here later is read
                    error=message,
                    finished_at=_now(),
                )
                self._rejected(known.path, message)
        else:  # loaded or in flight: its row describes the file that was here before
            self._error(
                f"{message} The ledger keeps entry {known.id} ({known.status}) of the file "
                "that was here before."
            )

    def _look_for_in_flight(self, unlisted: dict[str, str]) -> None:
        """Mark missing the files registered earlier that are gone, not merely out of sight."""
        if not self.in_flight:
            return
        if not self.zone.exists():  # unmounted, say: nothing is known gone
            self._error(
                f"landing directory {self.zone.location} of stream {self.source.name!r} "
                f"is not there; expected it to hold {len(self.in_flight)} file(s) registered "
                "by earlier runs and not loaded yet"
            )
            return
        hidden = [d.rstrip("/") + "/" for d in unlisted]
        for row in self.in_flight.values():
            if not row.path.startswith(tuple(hidden)):
                self._vanished(row)

    def _vanished(self, row: LandingFile) -> None:
        if row.id > self.committed:
            message = (
                f"{row.path}: vanished before it was loaded (registered "
                f"{row.registered_at:%Y-%m-%d %H:%M:%S} by run {row.run_id}); nothing of it "
                "was committed. Deliver it again to have it loaded."
            )
            self.store.update_landing_file(
                row.id, status=MISSING, error=message, finished_at=_now()
            )
            self.report.files_missing += 1
            self._error(message)
            return
        # Bronze records this id or a later one: a crash may have come after its bronze
        # commit. Only the same bytes can finish it without loading anything twice.
        self._error(
            f"{row.path}: vanished before its load was recorded, and bronze already records "
            f"ingest batch {self.committed} (its ledger id is {row.id}), so part of it may be "
            "in bronze. It stays registered: restore the same file under the same name."
        )

    # ------------------------------------------------------------------ loading

    def _load_all(self, pending: list[tuple[LandingFile, StagedCopy]]) -> None:
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
        """Load files of disjoint ids in one scan, one Spark job and one bronze commit,
        under the app transaction of the group's last ledger id: the commit lands all of
        them or none, and a rerun after it finds each file's rows in bronze
        (:meth:`_in_bronze`). Each file keeps its own ledger row and quarantine append. Its
        counts come from its footer when the group's observation found no record to hold
        back (the usual case), else from a count of its own. A group whose write fails on a
        file Spark cannot read is loaded file by file, so that only that file is rejected."""
        if len(group) <= 1 or len(_staged_names(group)) < len(group):
            for row, staged, parsed in group:
                self._load(row, staged, parsed)
            return
        counts = Observation(f"ingest.{self.source.name}.{group[0][0].id}-{uuid.uuid4().hex[:8]}")
        known = self._group_known(group)
        last = group[-1][0]
        try:
            outcome = self.engine.append(
                self.source.bronze_path,
                self._group_valid(group, counts, known),
                AppTransaction(self._app, last.id),
            )
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
            "ingest %s: %d files (ledger ids %d-%d) in one bronze commit",
            self.source.name,
            len(group),
            group[0][0].id,
            last.id,
        )
        observed = counts.get if outcome.committed else {}
        footers = sum(parsed.rows or 0 for _, _, parsed in group)
        clean = (
            not observed.get("bad")
            and observed.get("received") == footers
            and all(parsed.rows is not None for _, _, parsed in group)
        )
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
        return known_records(
            self.engine,
            self.source.bronze_path,
            id_column,
            BATCH_ID,
            SOURCE_FILE,
            group[0][0].id,
            lambda: IdRange(min(r.low for r in ranges), max(r.high for r in ranges)),
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
                self._reject(row, str(unreadable(e, self.source, path)))
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
        self.store.update_landing_file(
            row.id,
            status=LOADED,
            records_received=received,
            records_loaded=received - bad,
            records_quarantined=bad - resent,
            records_resent=resent,
            finished_at=_now(),
        )
        self.report.files_loaded += 1
        self.report.records_received += received
        self.report.records_loaded += received - bad
        self.report.records_quarantined += bad - resent
        self.report.records_resent += resent
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

        return known_records(
            self.engine,
            self.source.bronze_path,
            id_column,
            BATCH_ID,
            SOURCE_FILE,
            row.id,
            ids,
        )

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
            self._reject(row, str(e))
            return None

    # ------------------------------------------------------------------ reporting

    def _reject(self, row: LandingFile, message: str) -> None:
        self.store.update_landing_file(row.id, status=REJECTED, error=message, finished_at=_now())
        self._rejected(row.path, message)

    def _rejected(self, path: str, message: str) -> None:
        self.report.files_rejected += 1
        self.reported.add(path)
        self._error(message)

    def _error(self, message: str) -> None:
        logger.error("%s", message)
        self.report.errors.append(message)

    def _remind_rejected(self) -> None:
        """Report again every rejected file still in the landing directory (see module doc)."""
        still = rejected_in_place(self.store, self.source.name, self.zone)
        self.report.files_rejected_in_place = len(still)
        for row in still:
            if row.path not in self.reported:
                when = f"{row.finished_at:%Y-%m-%d %H:%M:%S}" if row.finished_at else "earlier"
                self._error(f"still in the landing zone, rejected {when}: {row.error}")

    def _log_summary(self) -> None:
        report = self.report
        logger.info(
            "ingest %s: %d file(s) loaded, %d skipped, %d rejected, %d missing, %d rejected "
            "still in place; %d record(s) received, %d loaded, %d quarantined",
            self.source.name,
            report.files_loaded,
            report.files_skipped,
            report.files_rejected,
            report.files_missing,
            report.files_rejected_in_place,
            report.records_received,
            report.records_loaded,
            report.records_quarantined,
        )
