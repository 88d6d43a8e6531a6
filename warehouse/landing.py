"""Landing-zone ingestion: admit the complete files of a stream's landing zone (local
directory or object-store prefix), each registered once in the state store's ledger by
path, size and SHA-256, then load them into bronze (:mod:`warehouse.bronze_load`).

Admission decides per listed file: new (registered, staged), the same content again
(skipped), a duplicate of another file's content, changed content under a loaded name (an
error every run), refused or unreadable (rejected, left in place, reported every run),
vanished before it loaded (missing). The full contract, with how a crash resumes, is in
``docs/reliability.md``, "The landing zone's contract".
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from common.errors import RefusedFileError, UnreadableFileError
from warehouse.bronze_load import BronzeLoad, IngestLog, IngestReport
from warehouse.delta import DeltaEngine
from warehouse.landing_location import rejected_in_place, zone_for
from warehouse.landing_parse import FORMAT_NAMES, StreamSource
from warehouse.landing_zone import FetchedFile, LandingEntry, LandingZone, StagedCopy
from warehouse.state_landing import rejected_files_in_place
from warehouse.state_store import StateStore
from warehouse.state_tables import DUPLICATE, LOADED, MISSING, REGISTERED, REJECTED, LandingFile

# Exported as before; rejected_files_in_place answers for a local zone only (ingestion asks
# its zone: landing_location.rejected_in_place).
__all__ = ["IngestReport", "StreamSource", "ingest_stream", "rejected_files_in_place"]

logger = logging.getLogger(__name__)

TEXT_FORMATS = frozenset({"csv", "json"})

# A new file is a duplicate if its content is that of a file of these statuses.
DUPLICATE_OF = (REGISTERED, LOADED)
# Files whose same content is decided without its bytes (nothing is staged or loaded), so
# an object listed with their recorded ETag and size is not read: skipped or still rejected.
KNOWN_BY_ETAG = (LOADED, DUPLICATE, REJECTED)


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
        self.log = IngestLog(store, IngestReport(source.name))
        self.loader = BronzeLoad(spark, engine, source, self.log)
        self.text = source.format in TEXT_FORMATS
        # Files registered by earlier runs and not loaded yet; those not found are missing.
        self.in_flight = {row.path: row for row in store.landing_files(source.name, REGISTERED)}

    def run(self) -> IngestReport:
        entries, unlisted = self.zone.scan()
        for directory, reason in unlisted.items():
            self.log.report_error(
                f"{directory}: cannot be listed ({reason}); files below it are not ingested, "
                "or looked for, until it can be"
            )
        pending: list[tuple[LandingFile, StagedCopy]] = []
        ledger = self.store.landing_files_at(self.source.name, [e.path for e in entries])
        try:
            for entry in entries:
                admitted = self._admit(entry, ledger.get(entry.path))
                if admitted is not None:
                    pending.append(admitted)
            self._look_for_in_flight(unlisted)
            self.loader.load_all(sorted(pending, key=lambda item: item[0].id))
        finally:
            for _, staged in pending:
                staged.delete()
        self._remind_rejected()
        self._log_summary()
        return self.log.report

    # ------------------------------------------------------------------ admission

    def _admit(
        self, entry: LandingEntry, known: LandingFile | None
    ) -> tuple[LandingFile, StagedCopy] | None:
        """Register or skip one entry (``known``: its ledger row, if it has one); return the
        ledger row and staged copy to load, if any."""
        if entry.refusal is not None:
            self.in_flight.pop(entry.path, None)
            self._refuse(entry, known, entry.refusal)
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
        read = self._fetch(entry, known, temps, copy)
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
                self.log.reject(known, self._not_utf8(entry, read))
                return None
            logger.info("resume %s (ledger id %d)", path, known.id)
            return known, self.zone.place(temps[-1], known.id)
        if known is not None and same and known.status in KNOWN_BY_ETAG:
            self._same_again(entry, known)
            return None
        if not copy:  # a duplicate's name now holds new content: read it again, copying
            read = self._fetch(entry, known, temps, copy=True)
            if read is None:
                return None
        return self._register(entry, known, read, temps[-1])

    def _same_again(self, entry: LandingEntry, known: LandingFile) -> None:
        """The content the ledger knows, at the name of a loaded, duplicate or rejected file."""
        if known.status == REJECTED:
            return  # still rejected; _remind_rejected reports it
        self._skip(entry, known)

    def _fetch(
        self, entry: LandingEntry, known: LandingFile | None, temps: list[StagedCopy], copy: bool
    ) -> FetchedFile | None:
        try:
            read = self.zone.fetch(entry.path, stage=copy, check_utf8=self.text and copy)
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
        self, entry: LandingEntry, known: LandingFile | None, read: FetchedFile, temp: StagedCopy
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
        if known is not None:
            logger.info(
                "%s has new content since it was %s (ledger id %d); registering it again",
                path,
                known.status,
                known.id,
            )
        row = self.store.register_landing_file(
            self.source.name,
            path,
            read.size_bytes,
            read.sha256,
            self.run_id,
            status=status,
            error=error,
            etag=read.etag,
            replaces=None if known is None else known.id,
        )
        if status == DUPLICATE:
            logger.warning("%s", error)
            self.log.report.files_skipped += 1
            return None
        if status == REJECTED:
            self.log.rejected(row.path, error or "")
            return None
        return row, self.zone.place(temp, row.id)

    def _skip(self, entry: LandingEntry, known: LandingFile) -> None:
        # Debug: a long-lived stream lists every file still in its landing zone each tick
        # (the run's summary line counts them).
        logger.debug("skip %s: already %s (ledger id %d)", entry.path, known.status, known.id)
        self.log.report.files_skipped += 1

    def _changed(self, entry: LandingEntry, known: LandingFile, read: FetchedFile) -> None:
        self.log.report_error(
            f"{entry.path}: content changed since it was registered on "
            f"{known.registered_at:%Y-%m-%d %H:%M:%S} (sha256 {known.sha256[:12]}…, "
            f"{known.size_bytes} bytes; now {read.sha256[:12]}…, {read.size_bytes} bytes). "
            "Deliver corrections under a new file name."
        )

    def _not_utf8(self, entry: LandingEntry, read: FetchedFile) -> str:
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
            self.log.rejected(row.path, message)
        elif known.status in (REJECTED, DUPLICATE, MISSING):
            if (known.status, known.error, known.sha256) != (REJECTED, message, ""):
                self.store.update_landing_file(
                    known.id,
                    status=REJECTED,
                    sha256="",
                    etag=None,  # no content known: whatever is listed here later is read
                    error=message,
                    finished_at=datetime.now(UTC),
                )
                self.log.rejected(known.path, message)
        else:  # loaded or in flight: its row describes the file that was here before
            self.log.report_error(
                f"{message} The ledger keeps entry {known.id} ({known.status}) of the file "
                "that was here before."
            )

    def _look_for_in_flight(self, unlisted: dict[str, str]) -> None:
        """Mark missing the files registered earlier that are gone, not merely out of sight."""
        if not self.in_flight:
            return
        if not self.zone.exists():  # unmounted, say: nothing is known gone
            self.log.report_error(
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
        if row.id > self.loader.committed:
            message = (
                f"{row.path}: vanished before it was loaded (registered "
                f"{row.registered_at:%Y-%m-%d %H:%M:%S} by run {row.run_id}); nothing of it "
                "was committed. Deliver it again to have it loaded."
            )
            self.store.update_landing_file(
                row.id, status=MISSING, error=message, finished_at=datetime.now(UTC)
            )
            self.log.report.files_missing += 1
            self.log.report_error(message)
            return
        # Bronze records this id or a later one: a crash may have come after its bronze
        # commit. Only the same bytes can finish it without loading anything twice.
        self.log.report_error(
            f"{row.path}: vanished before its load was recorded, and bronze already records "
            f"ingest batch {self.loader.committed} (its ledger id is {row.id}), so part of it "
            "may be in bronze. It stays registered: restore the same file under the same name."
        )

    def _remind_rejected(self) -> None:
        """Report again every rejected file still in the landing directory (see module doc)."""
        still = rejected_in_place(self.store, self.source.name, self.zone)
        self.log.report.files_rejected_in_place = len(still)
        for row in still:
            if row.path not in self.log.reported:
                when = f"{row.finished_at:%Y-%m-%d %H:%M:%S}" if row.finished_at else "earlier"
                self.log.report_error(f"still in the landing zone, rejected {when}: {row.error}")

    def _log_summary(self) -> None:
        report = self.log.report
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
