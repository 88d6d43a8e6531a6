"""The object-store landing zone: every object below an ``s3://bucket/prefix``.

The same contract as a local landing directory (:mod:`warehouse.landing`), in the store's
terms:

- The zone is listed with ListObjectsV2, page after page, and holds every key below the
  prefix, in folders too, as a directory is walked with its subdirectories. A key one of
  whose names below the prefix (the file's or a folder's) starts with ``_`` or ``.`` is in
  progress and skipped, so ``<prefix>/_staging/`` (this zone's own) never is an entry, and
  so are folder markers (keys ending in ``/``).
- A PUT is atomic and a multipart upload is no object until it is completed, so a producer
  needs no temporary name: an upload in progress is never listed, never read.
- The refusals that guard a POSIX directory do not apply: an object store has no symlinks,
  FIFOs, sockets or devices, no ``O_NOFOLLOW`` and no path that resolves elsewhere. Every
  listed object is read; one that cannot be (access denied, archived) is rejected and left
  in place, as an unreadable local file is.
- Each object is read with one GET. Its bytes are hashed (and checked for UTF-8) and, when
  the file is to load, uploaded in the same pass as the staged copy
  ``<prefix>/_staging/<random hex>.<format>`` (one PUT, or a multipart upload of
  :data:`PART_BYTES` parts for a larger file), so the copy Spark reads through Hadoop S3A
  is exactly the bytes whose SHA-256 the ledger holds. Copies are deleted once their file
  is loaded or rejected; those a killed run left (and its unfinished uploads) are removed
  the next time a copy is staged.
- The location must not contain a glob character (Spark expands them in every path it
  reads); staged names are made of ``[0-9a-f.]``.
- The ledger names an object by its URL, ``s3://bucket/key``. One deleted after it was
  registered and before it loaded is not listed, so it is missing, as a vanished local file
  is; one that vanishes between the listing and its GET (``NoSuchKey``) too.
- The listing gives each object's ETag, and a read the ETag its GET answered with, so the
  ledger records the ETag of exactly the bytes it hashed. An object listed with the ETag
  and size the ledger holds for its key (a loaded, duplicate or rejected one) is the same
  content and is not read again (nor found unreadable, archived say): an ingest over
  objects that are all known makes one ListObjectsV2 request per 1000 keys, a HEAD per
  file the ledger holds rejected (is it still here?), and no GET. Any other ETag or size
  is read and hashed (changed content is caught as in a directory); so is an object whose
  row has no ETag (recorded before the ledger kept them), once, after which its ETag is
  recorded. The ETag is taken exactly as the server gives it, quotes and all, and trusted
  as the store's word for the content: S3's is the MD5 of a single PUT's bytes (derived
  from the parts' MD5s for a multipart upload), so a producer able to forge an MD5
  collision of the same size could replace a loaded object unnoticed. Loaded objects still
  cost their share of the listing: move them away, or let a lifecycle rule expire them, to
  keep it short.

Ingestion needs ``s3:ListBucket`` on the prefix, ``s3:GetObject`` on it, and
``s3:PutObject``, ``s3:DeleteObject``, ``s3:AbortMultipartUpload`` and
``s3:ListBucketMultipartUploads`` on ``<prefix>/_staging/``. Endpoint, region and
credentials come from the environment (:class:`~warehouse.object_store.ObjectStore`); Spark
must reach the same store (``SparkSettings.object_store``).
"""

from __future__ import annotations

import errno
import functools
import logging
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from common.errors import IngestionError, UnreadableFileError
from warehouse import landing_zone
from warehouse.object_store import ObjectLocation, ObjectStore

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

logger = logging.getLogger(__name__)

BLOCK_BYTES = 1 << 20  # read from the GET's body at a time
PART_BYTES = 8 << 20  # a staged copy larger than this is a multipart upload of such parts
LIST_PAGE_SIZE = 1000  # keys per ListObjectsV2 answer (S3's largest)
NOT_FOUND = frozenset({"NoSuchKey", "NotFound", "404"})
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ObjectCopy:
    """A staged copy in the object store."""

    zone: ObjectStoreZone = field(repr=False)
    key: str
    size_bytes: int

    @property
    def url(self) -> str:
        return self.zone.url_of(self.key)

    def open(self) -> pa.NativeFile:
        return self.zone.filesystem().open_input_file(f"{self.zone.bucket}/{self.key}")

    def delete(self) -> None:
        self.zone.delete(self.key)


class ObjectStoreZone:
    """The landing zone below ``s3://bucket/prefix``; see the module docstring."""

    def __init__(
        self,
        location: str,
        file_format: str,
        store: ObjectStore | None = None,
        page_size: int = LIST_PAGE_SIZE,
        part_bytes: int = PART_BYTES,
    ) -> None:
        found = ObjectLocation.parse(location)
        self.scheme = urlsplit(location).scheme.lower()
        self.bucket = found.bucket
        key = found.key.strip("/")
        self.prefix = f"{key}/" if key else ""
        self.format = file_format
        self.store = store if store is not None else ObjectStore.from_environment()
        self.page_size = page_size
        self.part_bytes = part_bytes
        self._client: Any = None
        self._staging_ready = False

    @property
    def location(self) -> str:
        return self.url_of(self.prefix).rstrip("/")

    def url_of(self, key: str) -> str:
        """``scheme://bucket/key`` (``""``: the bucket's own URL, ending in ``/``)."""
        return f"{self.scheme}://{self.bucket}/{key}"

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.store.client()
        return self._client

    def filesystem(self) -> pafs.FileSystem:
        return _arrow_filesystem(self.store)

    # ------------------------------------------------------------------ the zone

    def check_location(self, stream: str) -> None:
        landing_zone.require_literal(stream, self.location)

    def scan(self) -> tuple[list[landing_zone.LandingEntry], dict[str, str]]:
        """Every object below the prefix that is not in progress, oldest first; a listing
        the store refuses (no such bucket, access denied) makes the whole zone unlisted."""
        from botocore.exceptions import ClientError

        entries: list[landing_zone.LandingEntry] = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=self.prefix,
            PaginationConfig={"PageSize": self.page_size},
        )
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    entry = self._entry(item)
                    if entry is not None:
                        entries.append(entry)
        except ClientError as e:
            if _status(e) >= 500:
                raise  # the store is failing: the run fails, the next one lists again
            return [], {self.location: _describe(e)}
        return sorted(entries, key=lambda e: (e.mtime_ns, e.path)), {}

    def _entry(self, item: dict[str, Any]) -> landing_zone.LandingEntry | None:
        key: str = item["Key"]
        below = key[len(self.prefix) :]
        if not below or key.endswith("/"):
            return None  # the prefix's own marker, or a folder's
        if any(name.startswith(landing_zone.IN_PROGRESS) for name in below.split("/")):
            return None
        modified: datetime = item["LastModified"]
        mtime_ns = (modified - EPOCH) // timedelta(microseconds=1) * 1000
        return landing_zone.LandingEntry(
            self.url_of(key), int(item["Size"]), mtime_ns, None, _etag(item)
        )

    def exists(self) -> bool:
        # A prefix exists as long as the bucket does; a missing bucket fails the listing,
        # which the scan reports (its files are then not known to be gone).
        return True

    def fetch(self, path: str, *, stage: bool, check_utf8: bool) -> landing_zone.FetchedFile:
        from botocore.exceptions import ClientError

        key = self._key(path)
        staging_key = self._staging_key() if stage else None
        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if _code(e) in NOT_FOUND:
                raise FileNotFoundError(errno.ENOENT, "no such object", path) from e
            if _status(e) >= 500:
                raise
            raise UnreadableFileError(
                f"{path}: cannot be read ({_describe(e)}). It is left in place; make it "
                "readable or move it away."
            ) from e
        upload = _Upload(self, staging_key) if staging_key is not None else None
        body = answer["Body"]
        try:
            blocks = iter(functools.partial(body.read, BLOCK_BYTES), b"")
            digest = landing_zone.digest_of(
                blocks, check_utf8, None if upload is None else upload.write
            )
            staged = upload.finish() if upload is not None else None
        except BaseException:
            if upload is not None:
                upload.abort()
            raise
        finally:
            body.close()
        # The GET's own ETag, not the listing's: the object may have been replaced since.
        return digest.result(staged, _etag(answer))

    def place(self, staged: landing_zone.StagedCopy, file_id: int) -> landing_zone.StagedCopy:
        # The copy's random name is as safe from globs as a ledger id; a rename would be a
        # server-side copy of the whole file.
        return staged

    def holds(self, path: str) -> bool:
        from botocore.exceptions import ClientError

        if not path.startswith(self.url_of("")):
            return False  # a file of the stream's earlier landing zone: not in this one
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as e:
            if _code(e) in NOT_FOUND:
                return False
            if _status(e) >= 500:
                raise
            return True  # there, as far as anyone can tell: keep reporting it
        return True

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)

    # ------------------------------------------------------------------ staging

    def _key(self, path: str) -> str:
        start = self.url_of("")
        if not path.startswith(start):
            raise IngestionError(
                f"{path}: expected an object in {start} (the bucket of the stream's landing "
                f"zone {self.location}), found a path elsewhere"
            )
        return path[len(start) :]

    @property
    def _staging_prefix(self) -> str:
        return f"{self.prefix}{landing_zone.STAGING_DIR}/"

    def _staging_key(self) -> str:
        if not self._staging_ready:
            self._remove_leftovers()
            self._staging_ready = True
        return f"{self._staging_prefix}{uuid.uuid4().hex}.{self.format}"

    def _remove_leftovers(self) -> None:
        """Delete the copies and unfinished uploads a killed run left in the staging area.

        CLI commands hold the pipeline lease, so no other ingest stages here, and every
        copy is deleted once its file is done: whatever is here was left by a killed run."""
        with _writing_staged(self.url_of(self._staging_prefix)):
            objects = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self._staging_prefix
            )
            for page in objects:
                for item in page.get("Contents", []):
                    logger.info("removing staged copy %s left by an earlier run", item["Key"])
                    self.delete(item["Key"])
            uploads = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=self._staging_prefix
            )
            for page in uploads:
                for upload in page.get("Uploads", []):
                    logger.info("aborting the upload of %s left by an earlier run", upload["Key"])
                    self.client.abort_multipart_upload(
                        Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                    )


class _Upload:
    """A staged copy written as its file is read: one PUT, or a multipart upload once the
    file is larger than a part (:data:`PART_BYTES` unless the zone says otherwise)."""

    def __init__(self, zone: ObjectStoreZone, key: str) -> None:
        self.zone, self.key = zone, key
        self.buffer = bytearray()
        self.size_bytes = 0
        self.upload_id: str | None = None
        self.parts: list[dict[str, Any]] = []

    def write(self, block: bytes) -> None:
        self.buffer += block
        self.size_bytes += len(block)
        part = self.zone.part_bytes
        while len(self.buffer) >= part:
            self._send_part(bytes(self.buffer[:part]))
            del self.buffer[:part]

    def finish(self) -> ObjectCopy:
        client, bucket = self.zone.client, self.zone.bucket
        with self._writing():
            if self.upload_id is None:
                client.put_object(Bucket=bucket, Key=self.key, Body=bytes(self.buffer))
            else:
                if self.buffer:
                    self._send_part(bytes(self.buffer))
                client.complete_multipart_upload(
                    Bucket=bucket,
                    Key=self.key,
                    UploadId=self.upload_id,
                    MultipartUpload={"Parts": self.parts},
                )
        self.buffer.clear()
        return ObjectCopy(self.zone, self.key, self.size_bytes)

    def abort(self) -> None:
        """Leave nothing behind (best effort: the next run removes what stays)."""
        from botocore.exceptions import BotoCoreError, ClientError

        client, bucket = self.zone.client, self.zone.bucket
        try:
            if self.upload_id is not None:
                client.abort_multipart_upload(Bucket=bucket, Key=self.key, UploadId=self.upload_id)
            client.delete_object(Bucket=bucket, Key=self.key)
        except (BotoCoreError, ClientError) as e:
            logger.warning("could not remove the staged copy %s: %s", self.key, e)

    def _send_part(self, data: bytes) -> None:
        client, bucket = self.zone.client, self.zone.bucket
        with self._writing():
            if self.upload_id is None:
                started = client.create_multipart_upload(Bucket=bucket, Key=self.key)
                self.upload_id = str(started["UploadId"])
            number = len(self.parts) + 1
            sent = client.upload_part(
                Bucket=bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=data
            )
        self.parts.append({"ETag": sent["ETag"], "PartNumber": number})

    def _writing(self) -> AbstractContextManager[None]:
        return _writing_staged(self.zone.url_of(self.key))


@contextmanager
def _writing_staged(url: str) -> Iterator[None]:
    """Turns the store's refusal to take (or give up) a staged copy into an
    :class:`IngestionError`; a failing store (5xx) propagates as it is."""
    from botocore.exceptions import ClientError

    try:
        yield
    except ClientError as e:
        if _status(e) >= 500:
            raise
        raise _staging_error(url, e) from e


def _staging_error(url: str, error: Any) -> IngestionError:
    return IngestionError(
        f"{url}: cannot write the staged copy Spark reads ({_describe(error)}); ingestion "
        "needs to write, list and delete objects below <landing prefix>/_staging/"
    )


def _etag(answer: dict[str, Any]) -> str | None:
    """The ``ETag`` of a listed object or a GET's answer, as the server gave it (None if
    it gave none)."""
    found = answer.get("ETag")
    return str(found) if found else None


def _code(error: Any) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def _status(error: Any) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)


def _describe(error: Any) -> str:
    details = error.response.get("Error", {})
    return f"{details.get('Code', 'error')}: {details.get('Message', str(error))}"


@functools.lru_cache(maxsize=8)
def _arrow_filesystem(store: ObjectStore) -> pafs.FileSystem:
    import pyarrow.fs as pafs

    # One per store and process: each S3FileSystem holds its own connection pool.
    return pafs.S3FileSystem(**store.arrow_options())
