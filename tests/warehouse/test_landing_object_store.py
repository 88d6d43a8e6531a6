"""A landing zone in an object store (a real S3 server on loopback) keeps the local zone's
contract: complete objects only, once each, re-sends and duplicates noticed, a vanished
object reported, a killed run resumed to exactly once.

Bronze is read back with delta-rs, not the engine that wrote it, and compared as a multiset
with the rows the test put into the store. The module doubles as the child process of the
crash test: ``python -m tests.warehouse.test_landing_object_store ROOT LANDING BRONZE``
ingests once (the test arms ``ENRICH_CRASH_AT``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from sqlalchemy import text

from common.errors import ConfigError
from common.faults import CRASH_ENV_VAR
from pipeline.config import StreamConfig
from pipeline.runner import stream_source
from tests.conftest import REPO_ROOT
from tests.helpers import TEST_SPARK_CONF, assert_same_multiset
from tests.object_store_server import S3Server
from tests.warehouse.test_landing import COLUMNS, CSV_HEADER, good, json_lines, write_parquet
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.landing import IngestReport, StreamSource, ingest_stream
from warehouse.landing_s3 import ObjectStoreZone
from warehouse.landing_zone import LandingZone
from warehouse.object_store import ObjectLocation, ObjectStore, is_object_store
from warehouse.spark import SparkSettings, build_session, use_object_store
from warehouse.state_store import StateStore
from warehouse.state_tables import LandingFile

Format = Literal["json", "csv", "parquet"]


class Harness:
    """One stream ``s`` of ``fmt`` files landing at ``<landing>``, its bronze table at
    ``bronze`` (a local path or an object-store location) and its ledger in ``root``."""

    def __init__(
        self, spark: SparkSession, root: Path, landing: str, bronze: str, fmt: Format = "json"
    ) -> None:
        self.spark, self.landing, self.bronze_path = spark, landing, bronze
        self.source = source_of(landing, bronze, str(root / "quarantine"), fmt)
        self.engine = EmbeddedDeltaEngine(spark)
        self.store = StateStore(f"sqlite:///{root / 'state.db'}")
        self.objects = ObjectStore.from_environment()
        self.client = self.objects.client()
        self.where = ObjectLocation.parse(landing)
        self.runs = 0

    def key(self, name: str) -> str:
        return f"{self.where.key}/{name}"

    def path(self, name: str) -> str:
        return f"{self.landing}/{name}"

    def put(self, name: str, body: str | bytes) -> bytes:
        data = body.encode() if isinstance(body, str) else body
        self.client.put_object(Bucket=self.where.bucket, Key=self.key(name), Body=data)
        return data

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.where.bucket, Key=self.key(name))

    def ingest(self, zone: LandingZone | None = None) -> IngestReport:
        self.runs += 1
        run_id = f"run{self.runs}"
        self.store.start_run(run_id, "ingest")
        return ingest_stream(self.spark, self.engine, self.store, self.source, run_id, zone)

    def bronze(self) -> list[tuple[Any, ...]]:
        """(file name below the landing prefix, id, k, label) of every bronze row, by delta-rs."""
        options = self.objects.delta_options() if is_object_store(self.bronze_path) else None
        table = DeltaTable(self.bronze_path, storage_options=options).to_pyarrow_table(
            columns=["_source_file", "id", "k", "label"]
        )
        prefix = f"{self.landing}/"
        return [
            (r["_source_file"].removeprefix(prefix), r["id"], r["k"], r["label"])
            for r in table.to_pylist()
        ]

    def entry(self, name: str) -> LandingFile:
        found = self.store.landing_file("s", self.path(name))
        assert found is not None, f"{name} is not in the ledger"
        return found

    def etag(self, name: str) -> str:
        """The object's ETag as the store answers a HEAD (not through the zone)."""
        return str(self.client.head_object(Bucket=self.where.bucket, Key=self.key(name))["ETag"])

    def put_in_parts(self, name: str, body: str) -> bytes:
        """Upload ``body`` as a one-part multipart upload (an ETag of the ``<md5>-1`` kind)."""
        data, bucket, key = body.encode(), self.where.bucket, self.key(name)
        upload = self.client.create_multipart_upload(Bucket=bucket, Key=key)
        part = self.client.upload_part(
            Bucket=bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=data
        )
        self.client.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload["UploadId"],
            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
        )
        return data

    def counted_ingest(self) -> tuple[IngestReport, Counter[tuple[str, str]]]:
        """Ingest through a zone of its own whose requests are counted (:class:`Sent`)."""
        zone = ObjectStoreZone(self.landing, self.source.format)
        sent = Sent(zone, self.where.bucket)
        return self.ingest(zone), sent.requests

    def staged(self) -> list[str]:
        """Keys left in the staging area, and uploads left unfinished there."""
        staging = self.key("_staging/")
        listed = self.client.list_objects_v2(Bucket=self.where.bucket, Prefix=staging)
        uploads = self.client.list_multipart_uploads(Bucket=self.where.bucket, Prefix=staging)
        return [o["Key"] for o in listed.get("Contents", [])] + [
            u["Key"] for u in uploads.get("Uploads", [])
        ]


class Sent:
    """The requests a zone's S3 client sends, by (operation, key below the bucket).

    Counted in botocore's ``before-send`` event of that client, which fires once for every
    HTTP request (each retry too) just before it goes on the wire: an object the zone reads
    shows as a ``GetObject`` of its key. The zone's client is the only one that reads
    landing objects (Spark and pyarrow read only the staged copies, below ``_staging/``)."""

    def __init__(self, zone: ObjectStoreZone, bucket: str) -> None:
        self.bucket = bucket
        self.requests: Counter[tuple[str, str]] = Counter()
        zone.client.meta.events.register("before-send.s3", self._count)

    def _count(self, request: Any, event_name: str, **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        path = unquote(urlsplit(request.url).path)  # path-style: /<bucket>/<key>
        key = path.removeprefix(f"/{self.bucket}").removeprefix("/")  # "": the bucket's
        self.requests[(operation, key)] += 1


def ledger(row: LandingFile) -> tuple[Any, ...]:
    """What a ledger row says of its file (ORM rows compare by identity)."""
    return (row.id, row.status, row.size_bytes, row.sha256, row.etag, row.error)


def gets(sent: Counter[tuple[str, str]]) -> dict[str, int]:
    """The keys a counted ingest read (``GetObject``), with how often."""
    return {key: n for (operation, key), n in sent.items() if operation == "GetObject"}


def source_of(landing: str, bronze: str, quarantine: str, fmt: Format = "json") -> StreamSource:
    """The stream as the pipeline builds it from its config (``landing`` an s3:// location)."""
    stream = StreamConfig(
        landing=landing, format=fmt, columns=COLUMNS, event_time="ts", id_column="id"
    )
    # Without the id lookup, as in test_landing: these tests are of files.
    return dataclasses.replace(stream_source("s", stream, bronze, quarantine), id_column=None)


def rows(name: str, *ids: int) -> list[tuple[Any, ...]]:
    """Bronze rows of ``good(i)`` records delivered in ``name``."""
    return [(name, i, good(i)["k"], good(i)["label"]) for i in ids]


@pytest.fixture
def store_env(spark: SparkSession, s3_env: S3Server) -> S3Server:
    """The environment and the session's S3A settings pointed at the test's S3 server."""
    use_object_store(spark, ObjectStore.from_environment())
    return s3_env


@pytest.fixture
def h(spark: SparkSession, store_env: S3Server, s3_bucket: str, tmp_path: Path) -> Harness:
    return Harness(spark, tmp_path, f"s3://{s3_bucket}/landing", str(tmp_path / "bronze"))


# ------------------------------------------------------------------ what is read


def test_objects_below_the_prefix_load_and_unfinished_uploads_do_not(h: Harness) -> None:
    h.put("a.json", json_lines([good(1), good(2)]))
    h.put("sub/b.json", json_lines([good(3)]))  # a folder below the prefix, as a subdirectory
    for in_progress in ["_writing.json", ".hidden.json", "_tmp/inner.json", "sub/_part.json"]:
        h.put(in_progress, json_lines([good(90)]))
    h.put("folder/", b"")  # a folder marker is no file
    for outside in ["landing-2/x.json", "x.json"]:  # beside the prefix, not below it
        h.client.put_object(Bucket=h.where.bucket, Key=outside, Body=json_lines([good(91)]))
    big = json_lines([good(4), good(5)]).encode()
    upload = h.client.create_multipart_upload(Bucket=h.where.bucket, Key=h.key("big.json"))
    part = h.client.upload_part(
        Bucket=h.where.bucket,
        Key=h.key("big.json"),
        UploadId=upload["UploadId"],
        PartNumber=1,
        Body=big,
    )

    first = h.ingest()
    assert (first.files_loaded, first.records_loaded, first.errors) == (2, 3, [])
    assert_same_multiset(h.bronze(), rows("a.json", 1, 2) + rows("sub/b.json", 3))
    assert sorted(e.path for e in h.store.landing_files("s")) == [
        h.path("a.json"),
        h.path("sub/b.json"),
    ]

    h.client.complete_multipart_upload(
        Bucket=h.where.bucket,
        Key=h.key("big.json"),
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]},
    )
    second = h.ingest()
    assert (second.files_loaded, second.files_skipped, second.errors) == (1, 2, [])
    assert_same_multiset(
        h.bronze(), rows("a.json", 1, 2) + rows("sub/b.json", 3) + rows("big.json", 4, 5)
    )
    entry = h.entry("big.json")
    assert (entry.status, entry.size_bytes) == ("loaded", len(big))
    assert entry.sha256 == hashlib.sha256(big).hexdigest()
    assert h.staged() == []  # each staged copy is deleted once its file is loaded


def test_listing_reads_every_page(h: Harness) -> None:
    names = [f"p{i}.json" for i in range(5)]
    for i, name in enumerate(names):
        h.put(name, json_lines([good(i), good(10 + i)]))
    zone = ObjectStoreZone(h.landing, "json", page_size=2)  # three pages of a listing
    entries, unlisted = zone.scan()
    assert (sorted(e.path for e in entries), unlisted) == ([h.path(n) for n in names], {})
    report = h.ingest(zone)
    assert (report.files_loaded, report.records_loaded, report.errors) == (5, 10, [])
    assert_same_multiset(h.bronze(), [r for i, n in enumerate(names) for r in rows(n, i, 10 + i)])


def test_a_file_larger_than_a_part_is_staged_in_parts(h: Harness) -> None:
    padding = "x" * (64 * 1024)
    records = [{**good(i), "label": f"l{i}{padding}"} for i in range(100)]  # 6.4 MB
    data = h.put("large.json", json_lines(records))
    zone = ObjectStoreZone(h.landing, "json", part_bytes=5 << 20)  # S3's smallest part
    report = h.ingest(zone)
    assert (report.files_loaded, report.records_loaded, report.errors) == (1, 100, [])
    assert_same_multiset(h.bronze(), [("large.json", r["id"], r["k"], r["label"]) for r in records])
    entry = h.entry("large.json")
    assert (entry.size_bytes, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert h.staged() == []


@pytest.mark.parametrize(
    ("fmt", "reason"), [("csv", "columns do not match"), ("parquet", "cannot be read as Parquet")]
)
def test_csv_and_parquet_objects_are_checked_and_read_through_the_store(
    spark: SparkSession,
    store_env: S3Server,
    s3_bucket: str,
    tmp_path: Path,
    fmt: Format,
    reason: str,
) -> None:
    h = Harness(spark, tmp_path, f"s3://{s3_bucket}/landing", str(tmp_path / "bronze"), fmt)
    if fmt == "csv":  # the header is read through the store
        lines = [f"{i},{i % 3},l{i},2024-01-01 00:00:00\n" for i in (1, 2)]
        h.put("a.csv", CSV_HEADER + "".join(lines))
        h.put("bad.csv", "id,k,label,ts,surprise\n3,0,l3,2024-01-01 00:00:00,1\n")
    else:  # the footer is read through the store
        write_parquet(tmp_path / "a.parquet", [1, 2])
        h.put("a.parquet", (tmp_path / "a.parquet").read_bytes())
        h.put("bad.parquet", (tmp_path / "a.parquet").read_bytes()[:-20])  # its footer cut
    report = h.ingest()
    assert (report.files_loaded, report.files_rejected, report.records_loaded) == (1, 1, 2)
    (error,) = report.errors
    assert h.path(f"bad.{fmt}") in error and reason in error
    assert_same_multiset(h.bronze(), rows(f"a.{fmt}", 1, 2))
    assert h.staged() == []


def test_a_bucket_that_cannot_be_listed_is_reported(
    spark: SparkSession, store_env: S3Server, tmp_path: Path
) -> None:
    landing = f"s3://never-created-{uuid.uuid4().hex[:20]}/landing"
    h = Harness(spark, tmp_path, landing, str(tmp_path / "bronze"))
    report = h.ingest()
    (error,) = report.errors
    assert f"{h.landing}: cannot be listed (NoSuchBucket" in error
    assert (report.files_loaded, h.store.landing_files("s")) == (0, [])


# ------------------------------------------------------------------ each file once


def test_resent_changed_and_duplicate_objects_are_told_apart(h: Harness) -> None:
    a = json_lines([good(1), good(2)])
    h.put("a.json", a)
    assert h.ingest().files_loaded == 1
    h.put("a.json", a)  # delivered again: a new PUT of the same bytes
    resent = h.ingest()
    assert (resent.files_loaded, resent.files_skipped, resent.errors) == (0, 1, [])

    h.put("a.json", json_lines([good(1), good(2), good(99)]))  # changed under a loaded name
    h.put("c.json", json_lines([good(3)]))
    changed = h.ingest()
    assert changed.files_loaded == 1
    (error,) = changed.errors
    assert h.path("a.json") in error and "content changed since it was registered" in error

    h.put("c-copy.json", json_lines([good(3)]))  # the same bytes under another name
    duplicate = h.ingest()
    assert (duplicate.files_loaded, duplicate.files_skipped) == (0, 2)
    assert len(duplicate.errors) == 1 and "content changed" in duplicate.errors[0]  # every run
    copy = h.entry("c-copy.json")
    assert copy.status == "duplicate" and h.path("c.json") in (copy.error or "")
    assert_same_multiset(h.bronze(), rows("a.json", 1, 2) + rows("c.json", 3))


def test_rejected_object_is_reported_until_it_is_moved_away(h: Harness) -> None:
    bad = b'{"id": 1, "k": 1, "label": "caf\xe9", "ts": "2024-01-01T00:00:00Z"}\n'
    h.put("bad.json", bad)
    h.put("ok.json", json_lines([good(2)]))
    first = h.ingest()
    assert (first.files_loaded, first.files_rejected) == (1, 1)
    (error,) = first.errors
    assert "not valid UTF-8" in error and f"byte {bad.index(0xE9)}" in error
    again = h.ingest()
    assert (again.files_rejected, again.files_rejected_in_place) == (0, 1)
    (reminder,) = again.errors
    assert h.path("bad.json") in reminder and "still in the landing zone" in reminder
    h.delete("bad.json")
    cleared = h.ingest()
    assert (cleared.errors, cleared.files_rejected_in_place) == ([], 0)
    assert_same_multiset(h.bronze(), rows("ok.json", 2))
    assert h.staged() == []


# ------------------------------------------------------------------ known by their ETag


def test_objects_the_ledger_knows_by_etag_are_not_read_again(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Loaded, duplicate and rejected objects listed with the ETag and size the ledger
    recorded make no GET on later runs; they are skipped or reminded of as before.

    Requests are counted as the zone's boto3 client sends them (:class:`Sent`, botocore's
    ``before-send`` event): the first run shows every object's GET, so the count sees them."""
    # Listed by time modified (to the second), then name: names in the order of the PUTs.
    a = h.put("a.json", json_lines([good(1), good(2)]))
    h.put_in_parts("b.json", json_lines([good(3)]))  # a multipart ETag, "<md5>-1"
    h.put("c-copy.json", a)
    h.put("d-bad.json", b'{"id": 9, "k": 0, "label": "caf\xe9", "ts": "2024-01-01T00:00:00Z"}\n')
    first, sent = h.counted_ingest()
    assert (first.files_loaded, first.files_skipped, first.files_rejected) == (2, 1, 1)
    names = ["a.json", "b.json", "c-copy.json", "d-bad.json"]
    assert gets(sent) == {h.key(n): 1 for n in names}  # the counter sees every read
    assert {n: h.entry(n).etag for n in names} == {n: h.etag(n) for n in names}
    assert h.etag("b.json").endswith('-1"')
    statuses = {n: h.entry(n).status for n in names}
    assert statuses == {
        "a.json": "loaded",
        "b.json": "loaded",
        "c-copy.json": "duplicate",
        "d-bad.json": "rejected",
    }
    skipped = [
        f"skip {h.path(n)}: already {statuses[n]} (ledger id {h.entry(n).id})" for n in names[:3]
    ]

    for _ in range(2):  # the second and third run over the same objects
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="warehouse.landing"):  # skips: debug
            again, sent = h.counted_ingest()
        # One listing, and the reminder's HEAD of the rejected object, as before; no GET.
        assert sent == {("ListObjectsV2", ""): 1, ("HeadObject", h.key("d-bad.json")): 1}
        assert (again.files_loaded, again.files_skipped, again.files_rejected) == (0, 3, 0)
        assert again.files_rejected_in_place == 1
        (reminder,) = again.errors
        assert h.path("d-bad.json") in reminder and "still in the landing zone" in reminder
        assert [m for m in caplog.messages if m.startswith("skip ")] == skipped
    assert_same_multiset(h.bronze(), rows("a.json", 1, 2) + rows("b.json", 3))
    assert h.staged() == []


def test_content_changed_under_a_loaded_key_is_read_and_reported_on_every_run(
    h: Harness,
) -> None:
    """New bytes of the same size under a loaded key: a new ETag, so the object is read,
    and reported as changed content as before; restored, it is known again without a GET."""
    a = h.put("a.json", json_lines([good(1), good(2)]))
    assert h.ingest().files_loaded == 1
    loaded = h.entry("a.json")
    changed = h.put("a.json", json_lines([good(4), good(5)]))
    assert len(changed) == len(a) and h.etag("a.json") != loaded.etag

    for _ in range(2):
        report, sent = h.counted_ingest()
        assert gets(sent) == {h.key("a.json"): 1}
        (error,) = report.errors
        assert h.path("a.json") in error and "content changed since it was registered" in error
        assert f"now {hashlib.sha256(changed).hexdigest()[:12]}" in error
        assert (report.files_loaded, report.files_skipped) == (0, 0)
        assert ledger(h.entry("a.json")) == ledger(loaded)  # still what was loaded

    h.put("a.json", a)  # the loaded bytes back: S3's ETag is their MD5 again
    restored, sent = h.counted_ingest()
    assert (gets(sent), restored.errors, restored.files_skipped) == ({}, [], 1)
    assert_same_multiset(h.bronze(), rows("a.json", 1, 2))


def test_the_same_bytes_under_a_new_etag_are_read_once_and_then_known_by_it(h: Harness) -> None:
    """A re-delivery of a loaded file's bytes with another ETag (a multipart upload's) is
    read, skipped as identical, and its ETag recorded: the next run reads nothing."""
    a = json_lines([good(1)])
    h.put("a.json", a)
    assert h.ingest().files_loaded == 1
    before = ledger(h.entry("a.json"))
    h.put_in_parts("a.json", a)
    assert h.etag("a.json") != before[4]

    resent, sent = h.counted_ingest()
    assert (gets(sent), resent.files_skipped, resent.errors) == ({h.key("a.json"): 1}, 1, [])
    assert ledger(h.entry("a.json")) == (*before[:4], h.etag("a.json"), before[5])
    quiet, sent = h.counted_ingest()
    assert (gets(sent), quiet.files_skipped, quiet.errors) == ({}, 1, [])


def test_the_etag_recorded_is_that_of_the_bytes_read_not_of_the_listing(h: Harness) -> None:
    """An object replaced between the listing and its GET: the ledger holds the hash and
    ETag of the bytes the GET returned, so the listed bytes coming back later are new
    content (an ETag taken from the listing would have them skipped as loaded)."""
    listed = h.put("a.json", json_lines([good(1)]))
    listed_etag = h.etag("a.json")
    read = json_lines([good(2)]).encode()
    assert len(read) == len(listed)
    zone = ObjectStoreZone(h.landing, "json")

    def replace_before_the_get(request: Any, **_: Any) -> None:
        if request.url.endswith("/a.json") and h.etag("a.json") == listed_etag:
            h.put("a.json", read)  # through the harness's own client, not the zone's

    zone.client.meta.events.register("before-send.s3.GetObject", replace_before_the_get)
    assert h.ingest(zone).files_loaded == 1
    entry = h.entry("a.json")
    assert (entry.sha256, entry.etag) == (hashlib.sha256(read).hexdigest(), h.etag("a.json"))
    assert entry.etag != listed_etag
    assert_same_multiset(h.bronze(), rows("a.json", 2))

    h.put("a.json", listed)  # the bytes that were listed: ETag listed_etag again
    back, sent = h.counted_ingest()
    assert gets(sent) == {h.key("a.json"): 1}
    (error,) = back.errors
    assert "content changed since it was registered" in error


def test_a_ledger_from_before_etags_reads_each_object_once_then_knows_it(h: Harness) -> None:
    """A ledger written by schema version 2 (no ``etag`` column) is migrated when opened:
    its rows have no ETag, so each loaded object is read once more (and changed content
    caught); those that hash as recorded get their ETag and are not read after that."""
    h.put("a.json", json_lines([good(1), good(2)]))
    h.put("b.json", json_lines([good(3)]))
    assert h.ingest().files_loaded == 2
    with h.store.engine.begin() as connection:  # back to what schema version 2 wrote
        connection.execute(text("ALTER TABLE landing_files DROP COLUMN etag"))
        connection.execute(text("DELETE FROM schema_version"))
        connection.execute(
            text("INSERT INTO schema_version (version, applied_at) VALUES (2, CURRENT_TIMESTAMP)")
        )
    h.store.dispose()
    h.store = StateStore(h.store.url)
    assert [e.etag for e in h.store.landing_files("s")] == [None, None]
    changed = h.put("b.json", json_lines([good(4)]))  # same size, other bytes

    once, sent = h.counted_ingest()
    assert gets(sent) == {h.key("a.json"): 1, h.key("b.json"): 1}
    assert (once.files_skipped, len(once.errors)) == (1, 1)
    assert h.path("b.json") in once.errors[0] and "content changed" in once.errors[0]
    assert (h.entry("a.json").etag, h.entry("b.json").etag) == (h.etag("a.json"), None)

    after, sent = h.counted_ingest()
    assert gets(sent) == {h.key("b.json"): 1}  # only the changed one is read again
    assert (after.files_skipped, len(after.errors)) == (1, 1)
    assert f"now {hashlib.sha256(changed).hexdigest()[:12]}" in after.errors[0]
    assert_same_multiset(h.bronze(), rows("a.json", 1, 2) + rows("b.json", 3))


@pytest.mark.parametrize("prefix", ["land[1]", "land{a,b}", "land*"])
def test_landing_prefix_with_glob_characters_is_refused(
    spark: SparkSession, store_env: S3Server, s3_bucket: str, tmp_path: Path, prefix: str
) -> None:
    h = Harness(spark, tmp_path, f"s3://{s3_bucket}/{prefix}", str(tmp_path / "bronze"))
    h.put("a.json", json_lines([good(1)]))
    with pytest.raises(ConfigError, match="glob"):
        h.ingest()
    assert h.store.landing_files("s") == []


# ------------------------------------------------------------------ crashes


def test_a_run_killed_after_a_bronze_commit_reruns_to_exactly_once(
    spark: SparkSession, store_env: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    h = Harness(spark, tmp_path, f"s3://{s3_bucket}/landing", f"s3://{s3_bucket}/bronze")
    h.engine.create_table(h.source.bronze_path, h.source.bronze_schema)
    h.engine.create_table(h.source.quarantine_path, h.source.quarantine_schema)
    # Put in this order, they are listed (by time modified, then name) and committed so.
    h.put("f1.json", json_lines([good(1), good(2)]))
    f2 = h.put("f2.json", json_lines([good(3), good(4)]))
    h.put("f3.json", json_lines([good(5)]))
    # Killed right after its second bronze commit (f2's), before the ledger hears of it.
    killed = subprocess.Popen(
        [sys.executable, "-m", __name__, str(tmp_path), h.landing, h.bronze_path],
        cwd=REPO_ROOT,
        env={**os.environ, CRASH_ENV_VAR: "delta.after_commit:2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a process group of its own, with its JVM
    )
    try:
        _, stderr = killed.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(killed.pid, signal.SIGKILL)  # a JVM left behind
    assert killed.returncode == -signal.SIGKILL, stderr.decode()[-3000:]
    by_name = {Path(e.path).name: e for e in h.store.landing_files("s")}
    assert {n: e.status for n, e in by_name.items()} == {
        "f1.json": "loaded",
        "f2.json": "registered",  # committed to bronze; the ledger never heard
        "f3.json": "registered",  # not committed
    }
    before = rows("f1.json", 1, 2) + rows("f2.json", 3, 4)
    assert_same_multiset(h.bronze(), before)
    assert h.staged(), "the killed run should have left staged copies behind"

    h.delete("f2.json")
    h.delete("f3.json")
    vanished = h.ingest()
    assert (vanished.files_loaded, vanished.files_missing) == (0, 1)
    gone, committed = sorted(vanished.errors, key=lambda e: "f2.json" in e)
    assert h.path("f3.json") in gone and "vanished before it was loaded" in gone
    assert h.path("f2.json") in committed and "restore the same file" in committed
    assert (h.entry("f2.json").status, h.entry("f3.json").status) == ("registered", "missing")

    h.put("f2.json", f2)  # restored: the same bytes under the same name
    rerun = h.ingest()
    assert (rerun.files_loaded, rerun.records_loaded, rerun.errors) == (1, 2, [])
    assert h.entry("f2.json").status == "loaded"
    assert_same_multiset(h.bronze(), before)  # f2's rows once, f3's none
    assert h.staged() == []  # the killed run's copies are gone too
    quiet = h.ingest()
    assert (quiet.files_loaded, quiet.errors) == (0, [])  # f3 was reported once


def main(argv: list[str]) -> int:
    """The crash test's child: one ingest of stream ``s`` (see the module docstring)."""
    root, landing, bronze = Path(argv[0]), argv[1], argv[2]
    spark = build_session(
        SparkSettings(
            app_name="landing-crash",
            master="local[1]",
            conf=TEST_SPARK_CONF,
            object_store=ObjectStore.from_environment(),
        )
    )
    store = StateStore(f"sqlite:///{root / 'state.db'}")
    store.start_run("killed", "ingest")
    source = source_of(landing, bronze, str(root / "quarantine"))
    ingest_stream(spark, EmbeddedDeltaEngine(spark), store, source, "killed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
