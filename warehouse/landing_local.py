"""The local landing zone: a directory, walked with its subdirectories.

Only regular files inside the landing directory are read. A symlink (to a file or a
directory, even one inside the zone), a FIFO, socket or device, or a path that resolves
outside the landing directory is refused (:mod:`warehouse.landing` records it). Files are
opened with ``O_NOFOLLOW``, and a file is hashed and copied to
``<landing>/_staging/<ledger id>.<format>`` in one pass, so that Spark reads exactly the
bytes whose hash the ledger holds (see :mod:`warehouse.landing_zone`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from common.errors import IngestionError, RefusedFileError, UnreadableFileError
from warehouse import landing_zone

if TYPE_CHECKING:
    import pyarrow as pa

logger = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 20
NOT_REGULAR = "is not a regular file (a FIFO, socket or device); only regular files are read"


@dataclass(frozen=True)
class LocalCopy:
    """A staged copy on local disk."""

    path: Path
    size_bytes: int

    @property
    def url(self) -> str:
        return str(self.path)

    def open(self) -> pa.NativeFile:
        import pyarrow as pa

        return pa.OSFile(str(self.path), "rb")

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)


class LocalZone:
    """A landing directory on a local (or mounted) file system."""

    def __init__(self, directory: Path, file_format: str) -> None:
        self.directory = directory
        self._staging = _Staging(directory, file_format)

    @property
    def location(self) -> str:
        return os.path.abspath(self.directory)

    def check_location(self, stream: str) -> None:
        landing_zone.require_literal(stream, self.location)

    def scan(self) -> tuple[list[landing_zone.LandingEntry], dict[str, str]]:
        return scan_landing(self.directory)

    def exists(self) -> bool:
        return self.directory.is_dir()

    def fetch(self, path: str, *, stage: bool, check_utf8: bool) -> landing_zone.FetchedFile:
        temp = self._staging.temp() if stage else None
        try:
            found = _read_file(Path(path), temp, check_utf8)
        except BaseException:
            if temp is not None:
                temp.unlink(missing_ok=True)
            raise
        return found if temp is None else replace(found, staged=LocalCopy(temp, found.size_bytes))

    def place(self, staged: landing_zone.StagedCopy, file_id: int) -> landing_zone.StagedCopy:
        return LocalCopy(self._staging.place(Path(staged.url), file_id), staged.size_bytes)

    def holds(self, path: str) -> bool:
        return os.path.lexists(path)


def scan_landing(landing_dir: Path) -> tuple[list[landing_zone.LandingEntry], dict[str, str]]:
    """Entries of a landing directory, oldest first, and the directories that cannot be listed
    (path: reason).

    Symlinks are reported, never followed; in-progress names (``_``, ``.``) are skipped.
    """
    if not landing_dir.is_dir():
        return [], {}
    root = os.path.realpath(landing_dir)
    entries: list[landing_zone.LandingEntry] = []
    unlisted: dict[str, str] = {}

    def cannot_list(error: OSError) -> None:
        unlisted[str(error.filename)] = error.strerror or str(error)

    for dirpath, dirnames, filenames in os.walk(landing_dir, onerror=cannot_list):
        # os.walk lists a symlink to a directory among the directories and does not descend.
        descend = []
        for name in sorted(dirnames):
            if name.startswith(landing_zone.IN_PROGRESS):
                continue
            path = Path(dirpath, name)
            if path.is_symlink():
                entries.append(_entry(path, root))
            else:
                descend.append(name)
        dirnames[:] = descend
        for name in filenames:
            if not name.startswith(landing_zone.IN_PROGRESS):
                try:
                    entries.append(_entry(Path(dirpath, name), root))
                except FileNotFoundError:
                    logger.info("%s vanished while the landing zone was listed", name)
    return sorted(entries, key=lambda e: (e.mtime_ns, e.path)), unlisted


def _entry(path: Path, root: str) -> landing_zone.LandingEntry:
    info = path.lstat()
    return landing_zone.LandingEntry(
        str(path), info.st_size, info.st_mtime_ns, _refusal(path, info, root)
    )


def _refusal(path: Path, info: os.stat_result, root: str) -> str | None:
    """The message refusing ``path``, or None for a file that is read."""
    reason = _refusal_reason(path, info, root)
    return None if reason is None else landing_zone.refused(str(path), reason)


def _refusal_reason(path: Path, info: os.stat_result, root: str) -> str | None:
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


def _read_file(path: Path, copy_to: Path | None, check_utf8: bool) -> landing_zone.FetchedFile:
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
                landing_zone.refused(str(path), "is a symlink; symlinks are never followed")
            ) from e
        raise UnreadableFileError(
            f"{path}: cannot be opened ({e.strerror}). It is left in place; make it readable "
            "or move it away."
        ) from e
    with os.fdopen(fd, "rb") as handle, ExitStack() as stack:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise RefusedFileError(landing_zone.refused(str(path), NOT_REGULAR))
        copy = stack.enter_context(copy_to.open("xb")) if copy_to is not None else None
        digest = landing_zone.digest_of(
            _blocks(handle, path), check_utf8, None if copy is None else copy.write
        )
    return digest.result()


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


class _Staging:
    """The copies Spark reads: ``<landing>/_staging/<ledger id>.<format>``.

    Every name in here is made of ``[0-9a-z.]``, so no Spark glob can match another file.
    """

    def __init__(self, landing_dir: Path, file_format: str) -> None:
        self.dir = Path(os.path.abspath(landing_dir / landing_zone.STAGING_DIR))
        self.format = file_format
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
