"""Entries by table version (``warehouse/delta/version_cache.py``): kept while the version's
commit file is the one they were built from; the newest one stands for the latest version
only while no newer commit file exists. On a local file system and on a real S3 server
(an object's ETag is its identity there)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from warehouse.delta.version_cache import VersionCache, commit_stamp, newest_commit
from warehouse.object_store import ObjectLocation, ObjectStore, storage_options


@dataclass(frozen=True)
class Place:
    """Where the tables of a test are: a local folder or a bucket."""

    base: str

    def __truediv__(self, name: str) -> str:
        return f"{self.base.rstrip('/')}/{name}"

    @property
    def remote(self) -> bool:
        return "://" in self.base


def commit(root: str, value: int) -> None:
    write_deltalake(
        root, pa.table({"a": [value]}), mode="append", storage_options=storage_options(root)
    )


def remove_table(root: str) -> None:
    if "://" not in root:
        shutil.rmtree(root)
        return
    found = ObjectLocation.parse(root)
    client = ObjectStore.from_environment().client()
    listed = client.list_objects_v2(Bucket=found.bucket, Prefix=f"{found.key}/")
    for item in listed.get("Contents", []):
        client.delete_object(Bucket=found.bucket, Key=item["Key"])


def remove_commit(root: str, version: int) -> None:
    name = f"{root}/_delta_log/{version:020d}.json"
    if "://" not in root:
        Path(name).unlink()
        return
    found = ObjectLocation.parse(name)
    ObjectStore.from_environment().client().delete_object(Bucket=found.bucket, Key=found.key)


@pytest.fixture(params=["local", "s3"])
def place(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Place]:
    if request.param == "local":
        yield Place(str(tmp_path))
        return
    server = request.getfixturevalue("s3_server")
    for name, value in server.environment().items():
        monkeypatch.setenv(name, value)
    yield Place(f"s3://{request.getfixturevalue('s3_bucket')}/tables")


def test_the_newest_entry_is_the_latest_until_a_newer_commit_lands(place: Place) -> None:
    root = place / "t"
    commit(root, 1)
    cache: VersionCache[str] = VersionCache(4)
    assert cache.latest(root) is None  # nothing cached yet
    cache.put(root, 0, "v0")
    assert cache.latest(root) == "v0"
    commit(root, 2)
    assert cache.latest(root) is None  # version 1 exists now
    assert cache.get(root, 0) == "v0"  # a version never changes
    cache.put(root, 1, "v1")
    assert cache.latest(root) == "v1"


def test_a_table_created_again_at_the_path_is_not_taken_for_the_old_one(place: Place) -> None:
    root = place / "t"
    commit(root, 1)
    commit(root, 2)
    cache: VersionCache[str] = VersionCache(4)
    cache.put(root, 1, "old v1")
    remove_table(root)
    commit(root, 3)
    commit(root, 4)  # version 1 again, another commit file
    assert cache.get(root, 1) is None
    assert cache.latest(root) is None


def test_dropping_a_table_forgets_its_entries_only(place: Place) -> None:
    a, b = place / "a", place / "b"
    commit(a, 1)
    commit(a, 2)
    commit(b, 1)
    cache: VersionCache[str] = VersionCache(4)
    cache.put(a, 0, "a0")
    cache.put(a, 1, "a1")
    cache.put(b, 0, "b0")
    cache.drop_table(a)
    assert cache.get(a, 0) is None and cache.get(a, 1) is None
    assert cache.latest(b) == "b0"


def test_a_table_is_held_while_one_of_its_entries_is_still_valid(place: Place) -> None:
    root, other = place / "t", place / "u"
    commit(root, 1)
    commit(other, 1)
    cache: VersionCache[str] = VersionCache(4)
    assert not cache.holds(root)
    cache.put(root, 0, "v0")
    assert cache.holds(root) and not cache.holds(other)
    commit(root, 2)
    assert cache.holds(root)  # an older version is still that version
    remove_table(root)
    assert not cache.holds(root)  # its commit file is gone


def test_a_range_is_checked_once_and_never_serves_a_table_created_again(place: Place) -> None:
    root = place / "t"
    for value in range(4):
        commit(root, value)
    cache: VersionCache[str] = VersionCache(8)
    for version in range(4):
        cache.put(root, version, f"old v{version}")
    assert cache.get_many(root, range(1, 5)) == ["old v1", "old v2", "old v3", None]
    remove_table(root)
    for value in range(3):
        commit(root, value)  # versions 0-2 again: other commit files, a new version 0
    assert cache.get_many(root, range(0, 4)) == [None, None, None, None]
    cache.put(root, 1, "new v1")
    assert cache.get_many(root, range(1, 3)) == ["new v1", None]
    # Version 0 gone (log retention): each entry is checked on its own, and still served.
    remove_commit(root, 0)
    assert cache.get_many(root, range(1, 2)) == ["new v1"]


def test_a_probe_tells_a_commit_file_from_one_written_again_and_sees_newer_ones(
    place: Place,
) -> None:
    root = place / "t"
    commit(root, 1)
    stamp = commit_stamp(root, 0)
    assert stamp is not None and commit_stamp(root, 1) is None
    assert newest_commit(root, 0) == (stamp, False)
    commit(root, 2)
    assert newest_commit(root, 0) == (stamp, True)
    assert newest_commit(root, 1) == (commit_stamp(root, 1), False)
    remove_table(root)
    assert newest_commit(root, 0) == (None, False)
    commit(root, 1)  # the same version again, another commit file (its own timestamp)
    again = commit_stamp(root, 0)
    assert again is not None and again != stamp


def test_the_latest_entry_survives_a_checkpoint_and_log_files_after_it(place: Place) -> None:
    """A checkpoint and the ``_last_checkpoint`` pointer sort around commit files; only a
    later commit makes a held entry stale."""
    from deltalake import DeltaTable

    root = place / "t"
    commit(root, 1)
    commit(root, 2)
    DeltaTable(root, storage_options=storage_options(root)).create_checkpoint()
    cache: VersionCache[str] = VersionCache(4)
    cache.put(root, 1, "v1")
    assert cache.latest(root) == "v1"
    commit(root, 3)
    assert cache.latest(root) is None
