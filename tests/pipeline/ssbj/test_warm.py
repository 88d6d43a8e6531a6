"""The state a process holds for its stage's next step (``pipeline/ssbj/warm.py``): served
only for the version it was held at, while that version's commit file is the one written
(on local disk and on a real S3 server)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from pipeline.ssbj.warm import WarmCache
from tests.object_store_server import S3Server
from warehouse.object_store import ObjectLocation, storage_options

ROWS = pa.table({"a": [1, 2]})


def commit(root: Path, value: int) -> None:
    write_deltalake(str(root), pa.table({"a": [value]}), mode="append")


def held_at_version_1(root: Path) -> WarmCache:
    """A state table at ``root`` with versions 0 and 1, its state held at version 1."""
    commit(root, 1)
    commit(root, 2)
    warm = WarmCache()
    warm.hold_state(str(root), 1, ROWS)
    return warm


def test_the_held_state_is_served_for_its_version_only(tmp_path: Path) -> None:
    root = tmp_path / "state"
    warm = held_at_version_1(root)
    assert warm.held_state(str(root), 1) is ROWS
    assert warm.held_state(str(root), 0) is None
    warm.hold_state(str(root), None, ROWS)  # a commit whose version is not known
    assert warm.held_state(str(root), 1) is None


def test_a_table_created_again_at_the_path_is_read_not_served(tmp_path: Path) -> None:
    root = tmp_path / "state"
    warm = held_at_version_1(root)
    shutil.rmtree(root)
    commit(root, 3)
    commit(root, 4)  # version 1 again, of another table
    assert warm.held_state(str(root), 1) is None
    assert warm.state_rows is None  # forgotten, not kept for a later look-up


def test_a_table_on_an_object_store_is_held_while_its_commit_object_is_the_same(
    s3_env: S3Server, s3_bucket: str
) -> None:
    """On S3 the commit object's ETag and size say whether the version is the one held."""
    root = f"s3://{s3_bucket}/state"
    options = storage_options(root)

    def commit_s3(value: int) -> None:
        write_deltalake(root, pa.table({"a": [value]}), mode="append", storage_options=options)

    commit_s3(1)
    commit_s3(2)
    warm = WarmCache()
    warm.hold_state(root, 1, ROWS)
    assert warm.held_state(root, 1) is ROWS
    found = ObjectLocation.parse(root)
    client = s3_env.client()
    for item in client.list_objects_v2(Bucket=found.bucket, Prefix=f"{found.key}/")["Contents"]:
        client.delete_object(Bucket=found.bucket, Key=item["Key"])
    commit_s3(3)
    commit_s3(4)  # version 1 again, of another table
    assert warm.held_state(root, 1) is None
    assert warm.state_rows is None
