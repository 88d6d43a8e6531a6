"""Entries by table version (``warehouse/delta/version_cache.py``): kept while the version's
commit file is the one they were built from; the newest one stands for the latest version
only while no newer commit file exists."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from warehouse.delta.version_cache import VersionCache


def commit(root: Path, value: int) -> None:
    write_deltalake(str(root), pa.table({"a": [value]}), mode="append")


def test_the_newest_entry_is_the_latest_until_a_newer_commit_lands(tmp_path: Path) -> None:
    root = tmp_path / "t"
    commit(root, 1)
    cache: VersionCache[str] = VersionCache(4)
    assert cache.latest(str(root)) is None  # nothing cached yet
    cache.put(str(root), 0, "v0")
    assert cache.latest(str(root)) == "v0"
    commit(root, 2)
    assert cache.latest(str(root)) is None  # version 1 exists now
    assert cache.get(str(root), 0) == "v0"  # a version never changes
    cache.put(str(root), 1, "v1")
    assert cache.latest(str(root)) == "v1"


def test_a_table_created_again_at_the_path_is_not_taken_for_the_old_one(tmp_path: Path) -> None:
    root = tmp_path / "t"
    commit(root, 1)
    commit(root, 2)
    cache: VersionCache[str] = VersionCache(4)
    cache.put(str(root), 1, "old v1")
    shutil.rmtree(root)
    commit(root, 3)
    commit(root, 4)  # version 1 again, another commit file
    assert cache.get(str(root), 1) is None
    assert cache.latest(str(root)) is None
    assert cache.latest("s3://bucket/t") is None  # object stores are not probed


def test_dropping_a_table_forgets_its_entries_only(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    commit(a, 1)
    commit(a, 2)
    commit(b, 1)
    cache: VersionCache[str] = VersionCache(4)
    cache.put(str(a), 0, "a0")
    cache.put(str(a), 1, "a1")
    cache.put(str(b), 0, "b0")
    cache.drop_table(str(a))
    assert cache.get(str(a), 0) is None and cache.get(str(a), 1) is None
    assert cache.latest(str(b)) == "b0"


def test_a_table_is_held_while_one_of_its_entries_is_still_valid(tmp_path: Path) -> None:
    root, other = tmp_path / "t", tmp_path / "u"
    commit(root, 1)
    commit(other, 1)
    cache: VersionCache[str] = VersionCache(4)
    assert not cache.holds(str(root))
    cache.put(str(root), 0, "v0")
    assert cache.holds(str(root)) and not cache.holds(str(other))
    commit(root, 2)
    assert cache.holds(str(root))  # an older version is still that version
    shutil.rmtree(root)
    assert not cache.holds(str(root))  # its commit file is gone


def test_a_range_is_checked_once_and_never_serves_a_table_created_again(tmp_path: Path) -> None:
    root = tmp_path / "t"
    for value in range(4):
        commit(root, value)
    cache: VersionCache[str] = VersionCache(8)
    for version in range(4):
        cache.put(str(root), version, f"old v{version}")
    assert cache.get_many(str(root), range(1, 5)) == ["old v1", "old v2", "old v3", None]
    shutil.rmtree(root)
    for value in range(3):
        commit(root, value)  # versions 0-2 again: other commit files, a new version 0
    assert cache.get_many(str(root), range(0, 4)) == [None, None, None, None]
    cache.put(str(root), 1, "new v1")
    assert cache.get_many(str(root), range(1, 3)) == ["new v1", None]
    # Version 0 gone (log retention): each entry is checked on its own, and still served.
    (root / "_delta_log" / f"{0:020d}.json").unlink()
    assert cache.get_many(str(root), range(1, 2)) == ["new v1"]
