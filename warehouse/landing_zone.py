"""Landing zones: where a stream's files arrive, a local directory or an object-store prefix.

:mod:`warehouse.landing` holds the contract (its module docstring) and loads what a zone
offers. A :class:`LandingZone` lists what has arrived, fetches a file once (its size and
SHA-256, a UTF-8 check, and, for a file that is to load, a staged copy of exactly those
bytes for Spark to read), cleans up staged copies and tells whether a file is still there.
An object store also lists each object's ETag, and a fetch returns the ETag of the bytes it
hashed: the ledger keeps it, so that an object listed again with the same ETag and size is
known without being read (:mod:`warehouse.landing`).
One small protocol keeps ingestion the same for both kinds of zone:

- :class:`~warehouse.landing_local.LocalZone`, a directory;
- :class:`~warehouse.landing_s3.ObjectStoreZone`, ``s3://bucket/prefix``.

:func:`warehouse.landing_location.zone_for` picks one for a stream's landing location. This
module holds what both share: the entries, what a fetch found, the staged copy and the
digest. Nothing here imports Spark.
"""

from __future__ import annotations

import codecs
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from common.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

STAGING_DIR = "_staging"
IN_PROGRESS = ("_", ".")  # name prefixes of files (and folders) still being written
# Hadoop expands these in any path Spark is given (a backslash escapes the next one).
GLOB_CHARACTERS = "*?[]{}\\"


@dataclass(frozen=True)
class LandingEntry:
    """Something found in a landing zone that is not in progress."""

    path: str  # the ledger's name for it: an absolute path, or ``s3://bucket/key``
    size_bytes: int
    mtime_ns: int
    # Why it is never read, as the message the ledger records (:func:`refused`); None for a
    # file that is read.
    refusal: str | None
    # The store's tag of the object's content, as listed (an object store's ETag, exactly as
    # the server gives it); None where a zone has none (a local file).
    etag: str | None = None


class StagedCopy(Protocol):
    """A copy of a landing file's bytes, under a name no Spark glob can widen."""

    @property
    def url(self) -> str:
        """What Spark reads: a local path or an object-store URL."""
        ...

    @property
    def size_bytes(self) -> int: ...

    def open(self) -> pa.NativeFile:
        """A random-access reader, for the driver's checks (Parquet footer, JSON keys)."""
        ...

    def delete(self) -> None:
        """Remove the copy; a copy already gone is not an error."""
        ...


@dataclass(frozen=True)
class FetchedFile:
    """What one pass over a landing file found (:meth:`LandingZone.fetch`)."""

    size_bytes: int
    sha256: str
    bad_utf8_at: int | None = None  # offset of the first byte that is not UTF-8
    staged: StagedCopy | None = None  # the copy of exactly these bytes, when one was asked for
    # The ETag the store answered with these very bytes (its GET's); None for a local file.
    etag: str | None = None


class LandingZone(Protocol):
    """Where one stream's files land; see the module docstring."""

    @property
    def location(self) -> str:
        """The zone as messages name it (and the prefix of every entry's path)."""
        ...

    def check_location(self, stream: str) -> None:
        """Raise :class:`ConfigError` if Spark would read the zone's staged copies as a
        glob pattern."""
        ...

    def scan(self) -> tuple[list[LandingEntry], dict[str, str]]:
        """Entries oldest first, and the places that cannot be listed (location: reason)."""
        ...

    def exists(self) -> bool:
        """False when the zone itself is not there (an unmounted directory, say)."""
        ...

    def fetch(self, path: str, *, stage: bool, check_utf8: bool) -> FetchedFile:
        """Fetch one file: hash it, staging a copy in the same pass if ``stage``. Raises
        FileNotFoundError if it is gone, :class:`RefusedFileError` if it must not be read,
        :class:`UnreadableFileError` if it cannot be; a failure to write the copy is the
        staging area's, not the file's, and propagates."""
        ...

    def place(self, staged: StagedCopy, file_id: int) -> StagedCopy:
        """The copy Spark is to read for ledger id ``file_id`` (``staged`` may move)."""
        ...

    def holds(self, path: str) -> bool:
        """True while something is at ``path`` (a rejected file not moved away yet)."""
        ...


def glob_characters_in(location: str) -> str:
    return "".join(sorted({c for c in location if c in GLOB_CHARACTERS}))


def require_literal(stream: str, location: str) -> None:
    """Raise :class:`ConfigError` if ``location``, stream ``stream``'s landing zone, holds a
    character Spark would expand as a glob pattern when it reads the copies staged below."""
    found = glob_characters_in(location)
    if found:
        raise ConfigError(
            f"stream {stream!r}: landing location {location} contains {found!r}; expected "
            f"a location without any of {GLOB_CHARACTERS!r}, which Spark would expand as a "
            "glob pattern when it reads the files staged below it. Rename it."
        )


def refused(path: str, reason: str) -> str:
    return (
        f"{path}: refused: {reason}. It is never read and stays where it is; move it away "
        "or replace it by a regular file."
    )


def digest_of(
    blocks: Iterable[bytes], check_utf8: bool, copy: Callable[[bytes], object] | None = None
) -> Digest:
    """The digest of ``blocks``, each handed to ``copy`` too (a staged copy being written):
    a file is read once, to hash and to stage it."""
    digest = Digest(check_utf8)
    for block in blocks:
        digest.update(block)
        if copy is not None:
            copy(block)
    return digest


class Digest:
    """Size, SHA-256 and the first byte that is not UTF-8 of bytes fed in order."""

    def __init__(self, check_utf8: bool) -> None:
        self._sha256 = hashlib.sha256()
        self._decoder = codecs.getincrementaldecoder("utf-8")() if check_utf8 else None
        self.size_bytes = 0
        self._bad_at: int | None = None

    def update(self, block: bytes) -> None:
        self._sha256.update(block)
        if self._decoder is not None and self._bad_at is None:
            self._bad_at = _utf8_error_at(self._decoder, block, self.size_bytes, final=False)
        self.size_bytes += len(block)

    def result(self, staged: StagedCopy | None = None, etag: str | None = None) -> FetchedFile:
        if self._decoder is not None and self._bad_at is None:
            self._bad_at = _utf8_error_at(self._decoder, b"", self.size_bytes, final=True)
        return FetchedFile(self.size_bytes, self._sha256.hexdigest(), self._bad_at, staged, etag)


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
