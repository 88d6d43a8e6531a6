"""The tests' S3 server (SeaweedFS, tests/object_store_server.py) behaves as S3 does where
the pipeline relies on it.

The object-store tests are only as good as their server: delta-rs commits a table version
with a PUT that must fail if the version's file exists (``If-None-Match: *``), so that of
two concurrent writers exactly one wins; tables' files are written in multipart uploads,
which must stay invisible until completed; and readers find log files and data files by
listing, page after page, from an offset. Each test here fails if the server does not.
"""

from __future__ import annotations

import hashlib
import random
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.object_store_server import S3Server

MiB = 1024 * 1024
WRITERS = 16  # on one key
KEYS = 4  # raced at once


def error_of(call: Any, **kwargs: Any) -> tuple[str, int]:
    """The S3 error code and HTTP status that ``call(**kwargs)`` fails with."""
    with pytest.raises(ClientError) as raised:
        call(**kwargs)
    response = raised.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def put_all(client: Any, bucket: str, keys: list[str]) -> None:
    with ThreadPoolExecutor(max_workers=WRITERS) as pool:
        list(pool.map(lambda key: client.put_object(Bucket=bucket, Key=key, Body=key), keys))


def all_pages(client: Any, **request: Any) -> list[dict[str, Any]]:
    """Every ListObjectsV2 page of ``request``, following continuation tokens by hand."""
    pages = [client.list_objects_v2(**request)]
    while pages[-1]["IsTruncated"]:
        token = pages[-1]["NextContinuationToken"]
        assert token, "a truncated page without a continuation token"
        pages.append(client.list_objects_v2(**request, ContinuationToken=token))
        assert len(pages) < 100, "the listing does not end"
    return pages


def keys_of(pages: list[dict[str, Any]]) -> list[str]:
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def test_concurrent_if_none_match_puts_have_exactly_one_winner(
    s3_server: S3Server, s3_bucket: str
) -> None:
    """16 writers PUT one new key at once with ``If-None-Match: *``, on several keys at once:
    on each key one succeeds, every other gets 412 PreconditionFailed, and the key holds the
    winner's body.

    SeaweedFS serializes the writers of one key through a lock it polls once a second, so
    the last of 16 losers hears its 412 after several seconds: the keys race side by side,
    not one after the other, to keep the test short.
    """
    # One attempt per request: a retry could turn a lost answer into a second try.
    client = s3_server.client(attempts=1, max_pool_connections=WRITERS * KEYS)
    keys = [f"_delta_log/{version:020d}.json" for version in range(KEYS)]
    # Distinct bodies of 64 KiB: the uploads take long enough to overlap.
    bodies = {
        (key, writer): f"{key} writer {writer}\n".encode() * 2000
        for key in keys
        for writer in range(WRITERS)
    }
    barrier = threading.Barrier(len(bodies), timeout=60)

    def put(key: str, writer: int) -> tuple[str, Any]:
        barrier.wait()  # all at once
        try:
            answer = client.put_object(
                Bucket=s3_bucket, Key=key, Body=bodies[key, writer], IfNoneMatch="*"
            )
        except ClientError as error:
            response = error.response
            return "refused", (
                response["Error"]["Code"],
                response["ResponseMetadata"]["HTTPStatusCode"],
            )
        return "written", answer["ETag"]

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        futures = {key_writer: pool.submit(put, *key_writer) for key_writer in bodies}
        outcomes = {key_writer: future.result() for key_writer, future in futures.items()}
    for key in keys:
        mine = {w: outcomes[key, w] for w in range(WRITERS)}
        winners = [w for w, (what, _) in mine.items() if what == "written"]
        assert len(winners) == 1, (key, mine)
        refusals = {detail for what, detail in mine.values() if what == "refused"}
        assert refusals == {("PreconditionFailed", 412)}, (key, mine)
        body = bodies[key, winners[0]]
        stored = client.get_object(Bucket=s3_bucket, Key=key)
        assert stored["Body"].read() == body, key
        assert stored["ETag"] == mine[winners[0]][1] == f'"{hashlib.md5(body).hexdigest()}"'
        # Afterwards, one writer alone is refused too, and the body stays the winner's.
        assert error_of(
            client.put_object, Bucket=s3_bucket, Key=key, Body=b"late", IfNoneMatch="*"
        ) == ("PreconditionFailed", 412)
        assert client.get_object(Bucket=s3_bucket, Key=key)["Body"].read() == body


def test_if_match_replaces_only_the_version_it_names(s3_server: S3Server, s3_bucket: str) -> None:
    """``If-Match: <etag>`` (delta-rs's conditional put mode ``etag`` for updates) succeeds
    for the current ETag only."""
    client = s3_server.client(attempts=1)
    first = client.put_object(Bucket=s3_bucket, Key="pointer", Body=b"v1")["ETag"]
    second = client.put_object(Bucket=s3_bucket, Key="pointer", Body=b"v2", IfMatch=first)
    assert error_of(
        client.put_object, Bucket=s3_bucket, Key="pointer", Body=b"v3", IfMatch=first
    ) == ("PreconditionFailed", 412)
    assert client.get_object(Bucket=s3_bucket, Key="pointer")["Body"].read() == b"v2"
    assert client.get_object(Bucket=s3_bucket, Key="pointer")["ETag"] == second["ETag"]


def test_multipart_upload_is_invisible_until_completed(s3_server: S3Server, s3_bucket: str) -> None:
    """Parts of 5 MiB, 5 MiB and 1 MiB: until completed, the key is neither listed nor
    readable (an existing object under it stays as it was); completed, it reads back byte
    for byte; an aborted upload leaves nothing, not even in ListMultipartUploads."""
    client = s3_server.client()
    rng = random.Random(20261128)
    parts = [rng.randbytes(5 * MiB), rng.randbytes(5 * MiB), rng.randbytes(MiB + 123)]
    new, replaced = "table/part-00000.parquet", "table/part-00001.parquet"
    client.put_object(Bucket=s3_bucket, Key=replaced, Body=b"the old object")

    uploads = {}
    for key in (new, replaced):
        uploads[key] = client.create_multipart_upload(Bucket=s3_bucket, Key=key)["UploadId"]
    done: dict[str, list[dict[str, Any]]] = {new: [], replaced: []}
    for number, body in enumerate(parts[:2], start=1):
        for key in (new, replaced):
            answer = client.upload_part(
                Bucket=s3_bucket, Key=key, UploadId=uploads[key], PartNumber=number, Body=body
            )
            done[key].append({"PartNumber": number, "ETag": answer["ETag"]})

    # In progress: not listed, not readable; the replaced key still reads the old object.
    listed = client.list_objects_v2(Bucket=s3_bucket)
    assert keys_of([listed]) == [replaced], listed.get("Contents")
    assert error_of(client.get_object, Bucket=s3_bucket, Key=new) == ("NoSuchKey", 404)
    assert client.get_object(Bucket=s3_bucket, Key=replaced)["Body"].read() == b"the old object"
    in_progress = client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert {(u["Key"], u["UploadId"]) for u in in_progress} == set(uploads.items())

    last = client.upload_part(
        Bucket=s3_bucket, Key=new, UploadId=uploads[new], PartNumber=3, Body=parts[2]
    )
    done[new].append({"PartNumber": 3, "ETag": last["ETag"]})
    client.complete_multipart_upload(
        Bucket=s3_bucket, Key=new, UploadId=uploads[new], MultipartUpload={"Parts": done[new]}
    )
    stored = client.get_object(Bucket=s3_bucket, Key=new)
    body = stored["Body"].read()
    assert len(body) == sum(len(p) for p in parts) == stored["ContentLength"]
    assert hashlib.sha256(body).digest() == hashlib.sha256(b"".join(parts)).digest()
    # S3's ETag of a multipart object: the MD5 of its parts' MD5s, dash, the part count.
    of_parts = hashlib.md5(b"".join(hashlib.md5(part).digest() for part in parts))
    assert stored["ETag"] == f'"{of_parts.hexdigest()}-{len(parts)}"'
    # A range across the boundary of the first two parts reads the same bytes.
    ranged = client.get_object(
        Bucket=s3_bucket, Key=new, Range=f"bytes={5 * MiB - 10}-{5 * MiB + 9}"
    )
    assert ranged["Body"].read() == (parts[0] + parts[1])[5 * MiB - 10 : 5 * MiB + 10]

    client.abort_multipart_upload(Bucket=s3_bucket, Key=replaced, UploadId=uploads[replaced])
    assert client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    assert error_of(
        client.upload_part,
        Bucket=s3_bucket,
        Key=replaced,
        UploadId=uploads[replaced],
        PartNumber=3,
        Body=b"late",
    ) == ("NoSuchUpload", 404)
    assert client.get_object(Bucket=s3_bucket, Key=replaced)["Body"].read() == b"the old object"
    listed = client.list_objects_v2(Bucket=s3_bucket)
    assert {item["Key"]: item["Size"] for item in listed["Contents"]} == {
        new: len(body),
        replaced: len(b"the old object"),
    }


def test_listing_pages_every_key_once_in_order(s3_server: S3Server, s3_bucket: str) -> None:
    """1,050 keys (with a Delta log's and partitions' characters) page out each exactly once
    in byte order: 100 a page, by default 1,000 a page, from StartAfter; a delimiter folds
    keys into CommonPrefixes, each listed once however small the pages."""
    client = s3_server.client(max_pool_connections=WRITERS)
    keys = [f"t/_delta_log/{n:020d}.json" for n in range(30)]
    keys += [
        f"t/date=2024-01-{d:02d}/part-{n}-{uuid.uuid4()}.parquet"
        for d in (1, 2)
        for n in range(500)
    ]
    keys += [f"t/ts=2024-01-01 00%3A00%3A{s:02d}/x+y é.parquet" for s in range(10)]
    keys += [f"t/{name}" for name in ("A", "Z", "a", "z", "_", "-", "~", "0", "9", "日本")]
    assert len(keys) == len(set(keys)) == 1050
    put_all(client, s3_bucket, keys)
    in_order = sorted(keys, key=lambda key: key.encode())

    pages = all_pages(client, Bucket=s3_bucket, Prefix="t/", MaxKeys=100)
    assert [page["KeyCount"] for page in pages] == [100] * 10 + [50]
    assert keys_of(pages) == in_order
    pages = all_pages(client, Bucket=s3_bucket, Prefix="t/")
    assert [page["KeyCount"] for page in pages] == [1000, 50]
    assert keys_of(pages) == in_order

    # From an offset, as a Delta reader lists its log from a version on.
    after = "t/_delta_log/00000000000000000011.json"
    listed = keys_of(all_pages(client, Bucket=s3_bucket, Prefix="t/_delta_log/", StartAfter=after))
    assert listed == [key for key in in_order if key.startswith("t/_delta_log/") and key > after]
    middle = in_order[517]
    listed = keys_of(all_pages(client, Bucket=s3_bucket, StartAfter=middle, MaxKeys=100))
    assert listed == in_order[518:]

    # Folders: one CommonPrefix per partition, files beside them as Contents.
    whole = client.list_objects_v2(Bucket=s3_bucket, Prefix="t/", Delimiter="/")
    assert not whole["IsTruncated"]
    prefixes = [entry["Prefix"] for entry in whole.get("CommonPrefixes", [])]
    expected_prefixes = sorted(
        {key[: key.index("/", 2) + 1] for key in keys if "/" in key[2:]}, key=str.encode
    )
    assert prefixes == expected_prefixes
    assert keys_of([whole]) == [key for key in in_order if "/" not in key[2:]]
    small = all_pages(client, Bucket=s3_bucket, Prefix="t/", Delimiter="/", MaxKeys=3)
    assert [e["Prefix"] for page in small for e in page.get("CommonPrefixes", [])] == prefixes
    assert keys_of(small) == keys_of([whole])
