"""Landing-zone ingestion: complete micro-batch files into a stream's bronze Delta table.

Contract:

- Producers place files atomically. Names starting with ``_`` or ``.`` are in progress and
  ignored (``_staging`` is this module's own directory), as are directories.
- Only regular files inside the landing directory are read. A symlink (to a file or a
  directory, even one inside the zone), a FIFO, socket or device, or a path that resolves
  outside the landing directory is refused: never opened, recorded ``rejected`` with the
  reason, left in place. Files are opened with ``O_NOFOLLOW``.
- The landing directory's path must not contain a glob character (``* ? [ ] { } \\``):
  Spark expands them in every path it reads. Such a stream fails with :class:`ConfigError`.
- Each file is registered in the state store's ledger once, by (stream, path) with its size
  and SHA-256. The pass that hashes a file that is to load also copies it to
  ``<landing>/_staging/<ledger id>.<format>`` and, for CSV and JSON, checks that it is
  UTF-8. Spark reads only that copy: exactly the bytes whose hash the ledger holds, under a
  name made of ``[0-9a-z._/-]`` below the landing directory, which no glob can widen. The
  copy is deleted once the file is loaded or rejected; copies left by a killed run are
  deleted by the next. Ingestion therefore needs write access to the landing directory.
- A re-delivered identical file is skipped with a log line. Different content under the
  name of a file that is loaded or in flight is reported as an error on every run and
  nothing of it is loaded; deliver corrections under a new name.
- A file whose SHA-256 equals that of a file of the same stream that is loaded or in flight
  is not loaded again: ledger status ``duplicate``, the error names the original, a
  warning is logged, and it counts as skipped.
- Files are loaded in ledger order, one bronze commit per file, with the app transaction
  ``ingest.<stream>`` at the file's ledger id. A crash anywhere leaves the file
  ``registered``; the next run resumes it and the transaction id makes the commit land once.
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

import codecs
import csv
import errno
import hashlib
import logging
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import (
    ConfigError,
    IngestionError,
    LedgerOrderError,
    RefusedFileError,
    SchemaDriftError,
    UnreadableFileError,
)
from warehouse.delta import AppTransaction, DeltaEngine
from warehouse.delta.file_stats import column_stats
from warehouse.delta.schema import arrow_to_spark
from warehouse.record_identity import (
    RESENT,
    IdRange,
    KnownRecords,
    conflict_message,
    id_range,
    identity_reason,
    known_records,
    resent_message,
    with_known,
)
from warehouse.state_store import (
    DUPLICATE,
    LOADED,
    MISSING,
    REGISTERED,
    REJECTED,
    LandingFile,
    StateStore,
    rejected_files_in_place,
)

logger = logging.getLogger(__name__)

CORRUPT = "_corrupt_record"
SOURCE_FILE = "_source_file"
BATCH_ID = "_batch_id"

STAGING_DIR = "_staging"
# Hadoop expands these in any path Spark is given (a backslash escapes the next one).
GLOB_CHARACTERS = "*?[]{}\\"
TEXT_FORMATS = frozenset({"csv", "json"})
FORMAT_NAMES = {"csv": "CSV", "json": "JSON", "parquet": "Parquet"}
BLOCK_BYTES = 1 << 20
# JSON files up to this size have their keys checked in the driver (``_json_keys_in_driver``).
DRIVER_JSON_BYTES = 128 * 1024**2
NOT_REGULAR = "is not a regular file (a FIFO, socket or device); only regular files are read"

# A new file is a duplicate if its content is that of a file of these statuses.
DUPLICATE_OF = (REGISTERED, LOADED)


@dataclass(frozen=True)
class StreamSource:
    """What ingestion needs to know about one stream."""

    name: str
    landing_dir: Path
    format: str
    schema: T.StructType
    required: tuple[str, ...]
    bronze_path: str
    quarantine_path: str
    bronze_schema: T.StructType
    quarantine_schema: T.StructType
    csv_header: bool = True
    csv_delimiter: str = ","
    id_column: str | None = None
    """A record's id across files (the stream's ``id_column``): re-sent records are not
    loaded twice (:mod:`warehouse.record_identity`). None: every record is new."""


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


@dataclass(frozen=True)
class LandingEntry:
    """Something found in a landing directory that is not in progress."""

    path: Path
    size_bytes: int
    mtime_ns: int
    refusal: str | None  # why it is never read; None for a regular file inside the zone


def scan_landing(landing_dir: Path) -> tuple[list[LandingEntry], dict[str, str]]:
    """Entries of a landing directory, oldest first, and the directories that cannot be listed
    (path: reason).

    Symlinks are reported, never followed; in-progress names (``_``, ``.``) are skipped.
    """
    if not landing_dir.is_dir():
        return [], {}
    root = os.path.realpath(landing_dir)
    entries: list[LandingEntry] = []
    unlisted: dict[str, str] = {}

    def cannot_list(error: OSError) -> None:
        unlisted[str(error.filename)] = error.strerror or str(error)

    for dirpath, dirnames, filenames in os.walk(landing_dir, onerror=cannot_list):
        # os.walk lists a symlink to a directory among the directories and does not descend.
        descend = []
        for name in sorted(dirnames):
            if name.startswith(("_", ".")):
                continue
            path = Path(dirpath, name)
            if path.is_symlink():
                entries.append(_entry(path, root))
            else:
                descend.append(name)
        dirnames[:] = descend
        for name in filenames:
            if not name.startswith(("_", ".")):
                try:
                    entries.append(_entry(Path(dirpath, name), root))
                except FileNotFoundError:
                    logger.info("%s vanished while the landing zone was listed", name)
    return sorted(entries, key=lambda e: (e.mtime_ns, str(e.path))), unlisted


def _entry(path: Path, root: str) -> LandingEntry:
    info = path.lstat()
    return LandingEntry(path, info.st_size, info.st_mtime_ns, _refusal(path, info, root))


def _refusal(path: Path, info: os.stat_result, root: str) -> str | None:
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"is a symlink (to {target}); symlinks are never followed"
    if not stat.S_ISREG(info.st_mode):
        return NOT_REGULAR
    resolved = os.path.realpath(path)
    if os.path.commonpath([resolved, root]) != root:
        return f"resolves to {resolved}, outside the landing directory {root}"
    return None


def ingest_stream(
    spark: SparkSession,
    engine: DeltaEngine,
    store: StateStore,
    source: StreamSource,
    run_id: str,
) -> IngestReport:
    """Load every new complete file of one stream; see the module docstring for guarantees."""
    _check_landing_dir(source)
    engine.create_table(source.bronze_path, source.bronze_schema)
    engine.create_table(source.quarantine_path, source.quarantine_schema)
    return _StreamIngest(spark, engine, store, source, run_id).run()


def _check_landing_dir(source: StreamSource) -> None:
    absolute = os.path.abspath(source.landing_dir)
    found = sorted({c for c in absolute if c in GLOB_CHARACTERS})
    if found:
        raise ConfigError(
            f"stream {source.name!r}: landing directory {absolute} contains {''.join(found)!r}; "
            f"expected a path without any of {GLOB_CHARACTERS!r}, which Spark would expand as "
            "a glob pattern when it reads the files staged below it. Rename the directory."
        )


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class _Read:
    """What one pass over a landing file found."""

    size_bytes: int
    sha256: str
    bad_utf8_at: int | None = None  # offset of the first byte that is not UTF-8


def _read_file(path: Path, copy_to: Path | None, check_utf8: bool) -> _Read:
    """Hash a regular file without following a symlink; copy it and check UTF-8 on the way.

    Raises FileNotFoundError if it is gone, :class:`RefusedFileError` if it is not a regular
    file (any more), :class:`UnreadableFileError` if it cannot be read. An error writing the
    copy is the staging area's, not the file's, and propagates as it is.
    """
    # O_NONBLOCK: a FIFO swapped in since the scan must not hang the open.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RefusedFileError(
                _refused(path, "is a symlink; symlinks are never followed")
            ) from e
        raise UnreadableFileError(
            f"{path}: cannot be opened ({e.strerror}). It is left in place; make it readable "
            "or move it away."
        ) from e
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")() if check_utf8 else None
    size, bad_at = 0, None
    with os.fdopen(fd, "rb") as handle, ExitStack() as stack:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise RefusedFileError(_refused(path, NOT_REGULAR))
        copy = stack.enter_context(copy_to.open("xb")) if copy_to is not None else None
        for block in _blocks(handle, path):
            digest.update(block)
            if copy is not None:
                copy.write(block)
            if decoder is not None and bad_at is None:
                bad_at = _utf8_error_at(decoder, block, size, final=False)
            size += len(block)
    if decoder is not None and bad_at is None:
        bad_at = _utf8_error_at(decoder, b"", size, final=True)
    return _Read(size, digest.hexdigest(), bad_at)


def _blocks(handle: BinaryIO, path: Path) -> Iterator[bytes]:
    while True:
        try:
            block = handle.read(BLOCK_BYTES)
        except OSError as e:
            raise UnreadableFileError(
                f"{path}: cannot be read ({e.strerror}). It is left in place; fix or move it."
            ) from e
        if not block:
            return
        yield block


def _refused(path: Path, reason: str) -> str:
    return (
        f"{path}: refused: {reason}. It is never read and stays where it is; move it away "
        "or replace it by a regular file."
    )


def _utf8_error_at(
    decoder: codecs.IncrementalDecoder, block: bytes, offset: int, *, final: bool
) -> int | None:
    """The file offset of the first invalid byte in ``block`` (at ``offset``), or None."""
    held = len(decoder.getstate()[0])  # bytes of a sequence split across blocks
    try:
        decoder.decode(block, final)
    except UnicodeDecodeError as e:
        return offset - held + e.start
    return None


class _Staging:
    """The copies Spark reads: ``<landing>/_staging/<ledger id>.<format>``.

    Every name in here is made of ``[0-9a-z.]``, so no Spark glob can match another file.
    """

    def __init__(self, source: StreamSource) -> None:
        self.dir = Path(os.path.abspath(source.landing_dir / STAGING_DIR))
        self.format = source.format
        self._ready = False

    def temp(self) -> Path:
        if not self._ready:
            self._prepare()
        return self.dir / f"{uuid.uuid4().hex}.part"

    def place(self, temp: Path, file_id: int) -> Path:
        final = self.dir / f"{file_id}.{self.format}"
        os.replace(temp, final)
        return final

    def _prepare(self) -> None:
        try:
            self.dir.mkdir(exist_ok=True)
        except FileExistsError as e:  # a file or a dangling symlink holds the name
            raise IngestionError(
                f"{self.dir}: expected the pipeline's staging directory, found another kind of "
                "file; move it away"
            ) from e
        except OSError as e:
            raise IngestionError(
                f"{self.dir}: cannot create the staging directory ({e.strerror}); ingestion "
                "needs write access to the landing directory"
            ) from e
        if self.dir.is_symlink():
            raise IngestionError(
                f"{self.dir}: expected the pipeline's staging directory, found a symlink; move "
                "it away (staged copies are never written through a link)"
            )
        # CLI commands hold the pipeline lease, so no other ingest uses this directory, and
        # every copy is deleted once its file is done: whatever is here was left by a killed
        # run.
        for leftover in self.dir.iterdir():
            if leftover.is_dir() and not leftover.is_symlink():
                logger.warning("%s: unexpected directory in the staging area; left alone", leftover)
                continue
            logger.info("removing staged copy %s left by an earlier run", leftover)
            leftover.unlink()
        self._ready = True


class _StreamIngest:
    """One ingest of one stream: admit what the landing directory holds, then load it."""

    def __init__(
        self,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        source: StreamSource,
        run_id: str,
    ) -> None:
        self.spark, self.engine, self.store = spark, engine, store
        self.source, self.run_id = source, run_id
        self.report = IngestReport(source.name)
        self.staging = _Staging(source)
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
        entries, unlisted = scan_landing(self.source.landing_dir)
        for directory, reason in unlisted.items():
            self._error(
                f"{directory}: cannot be listed ({reason}); files below it are not ingested, "
                "or looked for, until it can be"
            )
        pending: list[tuple[LandingFile, Path]] = []
        try:
            for entry in entries:
                admitted = self._admit(entry)
                if admitted is not None:
                    pending.append(admitted)
            self._look_for_in_flight(unlisted)
            for row, staged in sorted(pending, key=lambda item: item[0].id):
                self._load(row, staged)
        finally:
            for _, staged in pending:
                staged.unlink(missing_ok=True)
        self._remind_rejected()
        self._log_summary()
        return self.report

    # ------------------------------------------------------------------ admission

    def _admit(self, entry: LandingEntry) -> tuple[LandingFile, Path] | None:
        """Register or skip one entry; return the ledger row and staged copy to load, if any."""
        path = str(entry.path)
        known = self.store.landing_file(self.source.name, path)
        if entry.refusal is not None:
            self.in_flight.pop(path, None)
            self._refuse(entry, known, _refused(entry.path, entry.refusal))
            return None
        temps: list[Path] = []
        try:
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
                return known, self.staging.place(temps[-1], known.id)
            if known is not None and same and known.status == DUPLICATE:
                self._skip(entry, known)
                return None
            if known is not None and same and known.status == REJECTED:
                return None  # still rejected; _remind_rejected reports it
            if not copy:  # a duplicate's name now holds new content: read it again, copying
                read = self._read(entry, known, temps, copy=True)
                if read is None:
                    return None
            return self._register(entry, known, read, temps[-1])
        finally:
            for temp in temps:
                temp.unlink(missing_ok=True)  # a placed copy has moved away already

    def _read(
        self, entry: LandingEntry, known: LandingFile | None, temps: list[Path], copy: bool
    ) -> _Read | None:
        if copy:
            temps.append(self.staging.temp())
        try:
            read = _read_file(entry.path, temps[-1] if copy else None, self.text and copy)
        except FileNotFoundError:
            # Gone since the scan: if it was in flight, it is missing (unless it reappears).
            logger.info("%s vanished while it was being read", entry.path)
            return None
        except (RefusedFileError, UnreadableFileError) as e:
            self.in_flight.pop(str(entry.path), None)
            self._refuse(entry, known, str(e))
            return None
        self.in_flight.pop(str(entry.path), None)
        return read

    def _register(
        self, entry: LandingEntry, known: LandingFile | None, read: _Read, temp: Path
    ) -> tuple[LandingFile, Path] | None:
        """Register a new delivery: a new name, or new content under a never-loaded name."""
        path = str(entry.path)
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
            )
        else:
            logger.info(
                "%s has new content since it was %s (ledger id %d); registering it again",
                path,
                known.status,
                known.id,
            )
            row = self.store.reregister_landing_file(
                known.id, read.size_bytes, read.sha256, self.run_id, status=status, error=error
            )
        if status == DUPLICATE:
            logger.warning("%s", error)
            self.report.files_skipped += 1
            return None
        if status == REJECTED:
            self._rejected(row.path, error or "")
            return None
        return row, self.staging.place(temp, row.id)

    def _skip(self, entry: LandingEntry, known: LandingFile) -> None:
        logger.info("skip %s: already %s (ledger id %d)", entry.path, known.status, known.id)
        self.report.files_skipped += 1

    def _changed(self, entry: LandingEntry, known: LandingFile, read: _Read) -> None:
        self._error(
            f"{entry.path}: content changed since it was registered on "
            f"{known.registered_at:%Y-%m-%d %H:%M:%S} (sha256 {known.sha256[:12]}…, "
            f"{known.size_bytes} bytes; now {read.sha256[:12]}…, {read.size_bytes} bytes). "
            "Deliver corrections under a new file name."
        )

    def _not_utf8(self, entry: LandingEntry, read: _Read) -> str:
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
                    known.id, status=REJECTED, sha256="", error=message, finished_at=_now()
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
        if not self.source.landing_dir.is_dir():  # unmounted, say: nothing is known gone
            self._error(
                f"landing directory {self.source.landing_dir} of stream {self.source.name!r} "
                f"is not there; expected it to hold {len(self.in_flight)} file(s) registered "
                "by earlier runs and not loaded yet"
            )
            return
        hidden = [d.rstrip(os.sep) + os.sep for d in unlisted]
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

    def _load(self, row: LandingFile, staged: Path) -> None:
        """Load one staged file: its valid records to bronze, its malformed ones to the
        ingest quarantine, and the ledger row marked loaded.

        One Spark job reads, checks and writes the file: the records received and the
        malformed ones are counted by an observation as the bronze write passes them
        (``DataFrame.observe``). Only a file with malformed records is read a second time,
        for its quarantine append.
        """
        path = Path(row.path)
        try:
            parsed_file = self._parse(row, staged)
            if parsed_file is None:
                return
            parsed = parsed_file.frame
            counts = Observation(f"ingest.{self.source.name}.{row.id}.{uuid.uuid4().hex[:8]}")
            known = self._known(row, parsed_file, staged)
            valid, _ = split_records(
                parsed, self.source.schema, self.source.required, counts, known
            )
            try:
                outcome = self.engine.append(
                    self.source.bronze_path,
                    self._stamped(valid, row),
                    AppTransaction(self._app, row.id),
                )
            except Py4JJavaError as e:
                self._reject(row, str(_unreadable(e, self.source, path)))
                return
            if outcome.committed:
                observed = counts.get
                received, bad = int(observed["received"]), int(observed["bad"] or 0)
                resent = int(observed["resent"] or 0)
            else:
                # Bronze already held this file (a crash after its commit): no write job ran,
                # nothing was observed, so the file is counted again.
                received, bad, resent = _count_records(parsed, self.source, known)
            if bad:
                # A clean file commits nothing here: the bronze commit's app transaction
                # alone marks it loaded, so a rerun has nothing to repeat either way.
                _, malformed = split_records(
                    parsed, self.source.schema, self.source.required, known=known
                )
                self.engine.append(
                    self.source.quarantine_path,
                    self._quarantined(malformed, row),
                    AppTransaction(f"quarantine.{self.source.name}", row.id),
                )
        finally:
            staged.unlink(missing_ok=True)
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

    def _known(self, row: LandingFile, parsed: _ParsedFile, staged: Path) -> KnownRecords | None:
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

    def _parse(self, row: LandingFile, staged: Path) -> _ParsedFile | None:
        """Check a staged file and read it (lazily); reject it (and return None) if it is bad."""
        path = Path(row.path)
        try:
            if row.id < self.committed:
                raise LedgerOrderError(
                    f"{path}: cannot be committed under its ledger id {row.id}: bronze already "
                    f"records the later batch {self.committed}, and Delta would skip this "
                    "commit as done. Nothing of it is loaded; it was held back (changed or "
                    "unreadable) while later files loaded. If bronze holds no rows with "
                    f"{BATCH_ID} {row.id}, deliver it again under a new name."
                )
            return _parse(self.spark, self.source, staged, path)
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
        still = rejected_files_in_place(self.store, self.source.name)
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


def split_records(
    parsed: DataFrame,
    schema: T.StructType,
    required: tuple[str, ...],
    counts: Observation | None = None,
    known: KnownRecords | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Split parsed rows into valid rows and (record, reason) rows for quarantine.

    With ``known`` (bronze's records under the file's ids), a record whose id is among
    them is a re-send or a conflict (:mod:`warehouse.record_identity`), not valid.
    With ``counts``, every row is counted as it passes (``received``; ``bad``: those
    given a reason; ``resent``: the re-sends among them), whichever frame is computed.
    """
    columns = schema.fieldNames()
    corrupt = F.col(CORRUPT).isNotNull()
    missing = [F.when(F.col(c).isNull(), F.lit(c)) for c in required]
    missing_list = F.concat_ws(", ", *missing) if missing else F.lit("")
    reason = F.when(corrupt, F.lit("malformed: does not parse against the declared schema")).when(
        missing_list != "", F.concat(F.lit("null in required column(s): "), missing_list)
    )
    if known is not None:
        parsed = with_known(parsed, known, columns)
        resent, conflict = identity_reason(columns)
        reason = reason.when(resent, resent_message(known.id_column)).when(
            conflict, conflict_message(known.id_column)
        )
    tagged = parsed.withColumn("reason", reason.otherwise(F.lit(None)))
    if counts is not None:
        tagged = tagged.observe(
            counts,
            F.count(F.lit(1)).alias("received"),
            F.sum(F.col("reason").isNotNull().cast(T.LongType())).alias("bad"),
            F.sum(F.col("reason").startswith(RESENT).cast(T.LongType())).alias("resent"),
        )
    valid = tagged.where(F.col("reason").isNull()).select(*columns)
    malformed = tagged.where(F.col("reason").isNotNull()).select(
        F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*columns))).alias("record"), "reason"
    )
    return valid, malformed


@dataclass(frozen=True)
class _ParsedFile:
    """A staged file, read lazily, and its id range when its checks already found it."""

    frame: DataFrame
    ids: IdRange | None = None
    ids_checked: bool = False  # True: ``ids`` is the file's id range (None: no ids)


def _parse(spark: SparkSession, source: StreamSource, staged: Path, path: Path) -> _ParsedFile:
    """Read the staged copy ``staged`` of landing file ``path`` (named in messages)."""
    with_corrupt = T.StructType(
        [*source.schema.fields, T.StructField(CORRUPT, T.StringType(), True)]
    )
    if source.format == "json":
        checked = _check_json_keys(spark, source, staged, path)
        frame = (
            spark.read.schema(with_corrupt)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .json(str(staged))
        )
        return _ParsedFile(frame, checked.ids, checked.ids_checked)
    if source.format == "csv":
        _check_csv_header(source, staged, path)
        return _ParsedFile(
            spark.read.schema(with_corrupt)
            .option("header", source.csv_header)
            .option("sep", source.csv_delimiter)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .csv(str(staged))
        )
    footer = _check_parquet_schema(source, staged, path)
    frame = (
        spark.read.schema(source.schema)
        .parquet(str(staged))
        .withColumn(CORRUPT, F.lit(None).cast(T.StringType()))
    )
    # The footer's statistics state the id range when every row group has them.
    stats = column_stats(footer).get(source.id_column) if source.id_column else None
    if stats is None or stats.min is None or stats.max is None:
        return _ParsedFile(frame)
    return _ParsedFile(frame, IdRange(stats.min, stats.max), ids_checked=True)


def _count_records(
    parsed: DataFrame, source: StreamSource, known: KnownRecords | None
) -> tuple[int, int, int]:
    """(records, records not loaded, re-sent records among those) of a parsed file."""
    _, rejected = split_records(parsed, source.schema, source.required, known=known)
    found = parsed.agg(F.count(F.lit(1)).alias("n")).first()
    reasons = rejected.agg(
        F.count(F.lit(1)).alias("bad"),
        F.sum(F.col("reason").startswith(RESENT).cast(T.LongType())).alias("resent"),
    ).first()
    bad = int(reasons["bad"]) if reasons else 0
    resent = int(reasons["resent"] or 0) if reasons else 0
    return int(found["n"] if found else 0), bad, resent


def _unreadable(error: Py4JJavaError, source: StreamSource, path: Path) -> UnreadableFileError:
    """A file Spark cannot decode, as an ingestion error; any other failure (memory, a lost
    executor) is not the file's fault and propagates."""
    # Spark tags a failure to read or decode an input file with this error class.
    if "[FAILED_READ_FILE" not in str(error.java_exception):
        raise error
    return UnreadableFileError(
        f"{path}: cannot be read as {FORMAT_NAMES[source.format]}: "
        f"{_root_cause(error.java_exception)}. The file is left in place; fix the producer."
    )


def _root_cause(throwable: object) -> str:
    """The innermost Java exception message (``throwable`` is a py4j proxy)."""
    cause: object = throwable
    for _ in range(16):
        inner = cause.getCause()  # type: ignore[attr-defined]
        if inner is None:
            break
        cause = inner
    return str(cause)


def _drift(
    source: StreamSource, path: Path, found: list[str], detail: str = ""
) -> SchemaDriftError:
    expected = source.schema.fieldNames()
    extra = [c for c in found if c not in expected]
    missing = [c for c in expected if c not in found]
    return SchemaDriftError(
        f"{path}: columns do not match stream {source.name!r}: expected {expected}, found "
        f"{found}"
        + (f"; unexpected {extra}" if extra else "")
        + (f"; missing {missing}" if missing else "")
        + (f"; {detail}" if detail else "")
        + ". The file is left in place; fix the producer or the declared schema."
    )


def _check_json_keys(
    spark: SparkSession, source: StreamSource, staged: Path, path: Path
) -> _JsonCheck:
    """Check the keys of a JSON lines file against the declaration, and find the range of
    the stream's ids as the file spells them: in the driver with Arrow's JSON reader when
    the file is small and every line parses (no Spark job), else in one Spark job."""
    checked = _json_keys_in_driver(source, staged)
    if checked is None:
        checked = _json_keys_in_spark(spark, source, staged)
    keys = checked.keys
    expected = set(source.schema.fieldNames())
    unexpected = [k for k in keys if k not in expected]
    absent_required = [c for c in source.required if keys and c not in keys]
    if unexpected or absent_required:
        raise _drift(source, path, sorted(keys))
    return checked


@dataclass(frozen=True)
class _JsonCheck:
    """The keys a JSON lines file uses, and its id range when that was found."""

    keys: list[str]
    ids: IdRange | None = None
    ids_checked: bool = False  # True: ``ids`` is the range (None: no id in the file)


def _json_keys_in_driver(source: StreamSource, staged: Path) -> _JsonCheck | None:
    """Arrow's JSON reader (C++, multi-threaded: 0.06 s for 100k lines against 0.5-0.8 s
    for a Spark job) over a file of at most :data:`DRIVER_JSON_BYTES`; None when the file
    is larger or Arrow cannot read every line (a malformed record, a value whose type
    changes between lines): Spark's permissive reader decides those."""
    if staged.stat().st_size > DRIVER_JSON_BYTES:
        return None
    try:
        table = pa_json.read_json(staged)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    keys = table.schema.names
    id_column = source.id_column
    if id_column is None or id_column not in keys:
        return _JsonCheck(keys, None, ids_checked=id_column is not None)
    values = table.column(id_column)
    declared = source.schema[id_column].dataType
    integral = isinstance(declared, T.ByteType | T.ShortType | T.IntegerType | T.LongType)
    if not (
        (integral and pa.types.is_integer(values.type))
        or (isinstance(declared, T.StringType) and pa.types.is_string(values.type))
        or pa.types.is_null(values.type)
    ):
        return _JsonCheck(keys)  # the range is left to the parsed frame
    low_high = pc.min_max(values)
    low, high = low_high["min"].as_py(), low_high["max"].as_py()
    return _JsonCheck(keys, None if low is None else IdRange(low, high), ids_checked=True)


def _json_keys_in_spark(spark: SparkSession, source: StreamSource, staged: Path) -> _JsonCheck:
    lines = spark.read.text(str(staged))
    found = [F.array_distinct(F.flatten(F.collect_set(F.json_object_keys("value")))).alias("k")]
    if source.id_column is not None:
        kind = source.schema[source.id_column].dataType
        # A superset of the ids that will parse: a record that will not parse may add its
        # id (or nothing, where its text does not cast: try_cast, as ANSI casts would fail
        # the job) to the range, never remove one.
        text_id = F.get_json_object("value", f"$.{source.id_column}").try_cast(kind)
        found += [F.min(text_id).alias("low"), F.max(text_id).alias("high")]
    row = lines.agg(*found).first()
    keys = list(row["k"] or []) if row else []
    if source.id_column is None:
        return _JsonCheck(keys)
    ids = None if row is None or row["low"] is None else IdRange(row["low"], row["high"])
    return _JsonCheck(keys, ids, ids_checked=True)


def _check_csv_header(source: StreamSource, staged: Path, path: Path) -> None:
    if not source.csv_header:
        return
    # Admission has checked that the bytes are UTF-8.
    with staged.open(newline="", encoding="utf-8") as handle:
        header = next(csv.reader(handle, delimiter=source.csv_delimiter), [])
    if [h.strip() for h in header] != source.schema.fieldNames():
        raise _drift(source, path, [h.strip() for h in header])


def _check_parquet_schema(source: StreamSource, staged: Path, path: Path) -> pq.FileMetaData:
    """Check a Parquet file's columns and types against the declaration; its footer."""
    try:
        metadata = pq.read_metadata(staged)
        found = arrow_to_spark(metadata.schema.to_arrow_schema())
    except (pa.ArrowException, OSError) as e:  # empty, truncated, not Parquet at all
        raise UnreadableFileError(
            f"{path}: cannot be read as Parquet: {e}. The file is left in place; fix the producer."
        ) from e
    names = found.fieldNames()
    if sorted(names) != sorted(source.schema.fieldNames()):
        raise _drift(source, path, names)
    changed = [
        f"{f.name}: declared {source.schema[f.name].dataType.simpleString()}, "
        f"file has {f.dataType.simpleString()}"
        for f in found.fields
        if f.dataType != source.schema[f.name].dataType
    ]
    if changed:
        raise _drift(source, path, names, "; ".join(changed))
    return metadata
