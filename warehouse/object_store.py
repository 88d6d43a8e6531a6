"""Object-store locations (``s3://bucket/prefix``) and the settings that reach them.

A location with the ``s3`` or ``s3a`` scheme is in an S3-compatible object store; any other is a
local path. Endpoint, region and credentials never come from the pipeline's YAML: they are read
from the environment (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), which an Airflow task fills from the
``enrich_object_store`` connection (:mod:`orchestration.connections`). Each library gets them in
its own words: delta-rs storage options, Spark's S3A settings, a boto3 client. Secrets are
masked wherever the settings are shown.

Commits on the store are safe for concurrent writers because delta-rs puts a commit file with
``If-None-Match: *`` (``aws_conditional_put``), which the store must enforce (the object-store
tests check the server does, under concurrency).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from common.errors import ConfigError
from common.secrets import register_secret

if TYPE_CHECKING:
    import pyarrow.fs as pafs

SCHEMES = frozenset({"s3", "s3a"})
DEFAULT_REGION = "us-east-1"
MASK = "***"

# Spark reads and writes ``s3://`` and ``s3a://`` through Hadoop's S3A file system (the jars
# ``make object-store-deps`` fetches: hadoop-aws of Spark's Hadoop version and its AWS SDK).
S3A_FILESYSTEM = "org.apache.hadoop.fs.s3a.S3AFileSystem"


def is_object_store(location: str) -> bool:
    """True for ``s3://...`` and ``s3a://...`` locations."""
    return urlsplit(location).scheme.lower() in SCHEMES


def any_object_store(locations: list[str]) -> bool:
    return any(is_object_store(location) for location in locations)


@dataclass(frozen=True)
class ObjectLocation:
    """A bucket and a key (no leading slash) of an ``s3://`` location."""

    bucket: str
    key: str

    @classmethod
    def parse(cls, location: str) -> ObjectLocation:
        parts = urlsplit(location)
        if parts.scheme.lower() not in SCHEMES or not parts.netloc:
            raise ConfigError(
                f"expected an object-store location s3://bucket/prefix, found {location!r}"
            )
        return cls(parts.netloc, parts.path.lstrip("/"))

    def url(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"


@dataclass(frozen=True)
class ObjectStore:
    """Endpoint, region and credentials of the S3-compatible store the pipeline uses.

    ``endpoint`` is None for AWS itself; ``http://`` endpoints (a store on loopback) are
    allowed explicitly. Addressing is path-style (``endpoint/bucket/key``), which every
    S3-compatible server accepts. ``repr`` never shows the secrets.
    """

    endpoint: str | None
    region: str
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None = None

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> ObjectStore:
        """The store the environment names. A key id without its secret (or the reverse) is
        refused: half a credential would fall through to another provider silently."""
        env = os.environ if env is None else env
        key_id = env.get("AWS_ACCESS_KEY_ID") or None
        secret = env.get("AWS_SECRET_ACCESS_KEY") or None
        if (key_id is None) != (secret is None):
            found = "AWS_ACCESS_KEY_ID" if key_id else "AWS_SECRET_ACCESS_KEY"
            raise ConfigError(
                "the object store's credentials need both AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY; only {found} is set"
            )
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint is not None and urlsplit(endpoint).scheme not in {"http", "https"}:
            raise ConfigError(
                f"AWS_ENDPOINT_URL must be an http:// or https:// URL, found {endpoint!r}"
            )
        for value in (secret, env.get("AWS_SESSION_TOKEN")):
            if value:
                register_secret(value)  # masked in every later log line and message
        return cls(
            endpoint=endpoint.rstrip("/") if endpoint else None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            access_key_id=key_id,
            secret_access_key=secret,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
        )

    def __repr__(self) -> str:
        key = f"{self.access_key_id[:4]}{MASK}" if self.access_key_id else None
        secret = MASK if self.secret_access_key else None
        return (
            f"ObjectStore(endpoint={self.endpoint!r}, region={self.region!r}, "
            f"access_key_id={key!r}, secret_access_key={secret!r})"
        )

    __str__ = __repr__

    @property
    def allow_http(self) -> bool:
        return self.endpoint is not None and self.endpoint.startswith("http://")

    def delta_options(self) -> dict[str, str]:
        """delta-rs ``storage_options``: commits put with ``If-None-Match: *``."""
        options = {
            "AWS_REGION": self.region,
            "AWS_CONDITIONAL_PUT": "etag",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        }
        if self.endpoint is not None:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        if self.allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        if self.access_key_id is not None and self.secret_access_key is not None:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token is not None:
            options["AWS_SESSION_TOKEN"] = self.session_token
        return options

    def spark_conf(self) -> dict[str, str]:
        """Hadoop S3A settings (``spark.hadoop.fs.s3a.*``) for both ``s3://`` and ``s3a://``.

        Spark redacts settings whose names contain ``secret`` or ``access.key`` in its UI and
        logs (``spark.redaction.regex``)."""
        prefix = "spark.hadoop.fs.s3a."
        conf = {
            "spark.hadoop.fs.s3.impl": S3A_FILESYSTEM,
            "spark.hadoop.fs.s3a.impl": S3A_FILESYSTEM,
            f"{prefix}path.style.access": "true",
            f"{prefix}endpoint.region": self.region,
            # No ``_SUCCESS``-style directory markers left in table folders.
            f"{prefix}directory.marker.retention": "keep",
            # Uploads buffer in memory: S3A's disk buffer asks for a ``LocalFileSystem``, which
            # the product's raw local file system (warehouse.spark.REQUIRED_CONF) is not.
            f"{prefix}fast.upload.buffer": "bytebuffer",
        }
        if self.endpoint is not None:
            conf[f"{prefix}endpoint"] = self.endpoint
            conf[f"{prefix}connection.ssl.enabled"] = str(not self.allow_http).lower()
        if self.access_key_id is not None and self.secret_access_key is not None:
            conf[f"{prefix}access.key"] = self.access_key_id
            conf[f"{prefix}secret.key"] = self.secret_access_key
            provider = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
            if self.session_token is not None:
                conf[f"{prefix}session.token"] = self.session_token
                provider = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
            conf[f"{prefix}aws.credentials.provider"] = provider
        return conf

    def arrow_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`pyarrow.fs.S3FileSystem`."""
        options: dict[str, Any] = {"region": self.region, "force_virtual_addressing": False}
        if self.endpoint is not None:
            parts = urlsplit(self.endpoint)
            options["endpoint_override"] = parts.netloc
            options["scheme"] = parts.scheme
        if self.access_key_id is not None:
            options["access_key"] = self.access_key_id
            options["secret_key"] = self.secret_access_key
            options["session_token"] = self.session_token
        return options

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client, path-style, standard retries; ``config``: botocore ``Config``
        settings besides (timeouts, the connection pool, retries of its own)."""
        import boto3
        from botocore.config import Config

        settings = Config(s3={"addressing_style": "path"}, retries={"mode": "standard"})
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            aws_session_token=self.session_token,
            config=settings.merge(Config(**config)),
        )


def storage_options(location: str) -> dict[str, str] | None:
    """delta-rs ``storage_options`` for ``location``: the environment's store for an
    object-store location, None (delta-rs's defaults) for a local path."""
    if not is_object_store(location):
        return None
    return ObjectStore.from_environment().delta_options()


def filesystem_of(location: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system for ``location`` and the path it names there: S3 with the
    environment's endpoint and credentials for ``s3://``/``s3a://`` (``bucket/key``), the
    file system of any other URI, the local one for a path."""
    import pyarrow.fs as pafs

    if is_object_store(location):
        found = ObjectLocation.parse(location)
        store = ObjectStore.from_environment()
        return _s3_filesystem(store), f"{found.bucket}/{found.key}".rstrip("/")
    if "://" in location:
        return pafs.FileSystem.from_uri(location)
    return pafs.LocalFileSystem(), location


@dataclass(frozen=True)
class ObjectStamp:
    """What tells one object from another stored at the same key later: its ETag and size
    (a key written again, even with the same bytes, is a later ``LastModified`` as well,
    but an S3 PUT's ETag of different content differs, and the pipeline only compares
    objects it never rewrites)."""

    etag: str
    size: int


def object_stamp(location: str) -> ObjectStamp | None:
    """The stamp of the object at ``location`` (one HEAD request), None when none is there."""
    import botocore.exceptions

    found = ObjectLocation.parse(location)
    try:
        head = _client(ObjectStore.from_environment()).head_object(
            Bucket=found.bucket, Key=found.key
        )
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
            return None
        raise
    return ObjectStamp(str(head["ETag"]), int(head["ContentLength"]))


def objects_after(folder: str, start_after: str, limit: int) -> list[tuple[str, ObjectStamp]]:
    """The first ``limit`` objects of ``folder`` (an ``s3://`` prefix ending in ``/``) whose
    names sort after ``start_after``, as (name within the folder, stamp): one
    ListObjectsV2 request however long the folder."""
    found = ObjectLocation.parse(folder)
    prefix = found.key if found.key.endswith("/") else f"{found.key}/"
    page = _client(ObjectStore.from_environment()).list_objects_v2(
        Bucket=found.bucket, Prefix=prefix, StartAfter=f"{prefix}{start_after}", MaxKeys=limit
    )
    return [
        (str(item["Key"])[len(prefix) :], ObjectStamp(str(item["ETag"]), int(item["Size"])))
        for item in page.get("Contents", [])
    ]


@functools.lru_cache(maxsize=8)
def _client(store: ObjectStore) -> Any:
    # One per store and process: creating a boto3 client costs tens of milliseconds, and a
    # client is safe to share between threads.
    return store.client()


@functools.lru_cache(maxsize=8)
def _s3_filesystem(store: ObjectStore) -> pafs.S3FileSystem:
    import pyarrow.fs as pafs

    # One per store and process: each S3FileSystem holds its own connection pool.
    return pafs.S3FileSystem(**store.arrow_options())
