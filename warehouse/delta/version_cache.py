"""What an engine built for one version of a table, kept while that version's commit file is
the one it was built from.

A Delta version never changes once committed, so anything derived from it (its file list,
statistics, schema) can be built once per process. The one way the same path and version
can name other data is a table deleted and created again at that path: the cache keys each
entry by the commit file's identity and drops an entry whose commit file is not that file
any more. On a local file system the identity is the file's inode, size and mtime (a stat);
on an object store it is the object's ETag and size (one HEAD request, or one listing that
also says whether a newer commit exists: a look-up costs one small request instead of
opening the table, which lists its log and reads every commit since the checkpoint).

Invariant: :meth:`VersionCache.get` returns a value only if it was :meth:`put` for the same
table root and version while that version's commit file had the identity it has now.
:meth:`VersionCache.get_many` keeps it with one check for a whole range: each entry also
records the identity of the table's first commit file (version 0) when it was put, and
while that file is still the same file the table was not created again, so no commit file
of it was replaced (commit files are written once, never rewritten).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from warehouse.delta.table_paths import commit_file_location
from warehouse.object_store import ObjectStamp, is_object_store, object_stamp, objects_after

Value = TypeVar("Value")
CommitStamp = tuple[int, int, int] | ObjectStamp


def commit_stamp(root: str, version: int) -> CommitStamp | None:
    """The identity of a version's commit file: inode, size and mtime on a local file
    system, ETag and size on an object store; None for a commit file that is not there (log
    retention removed it: nothing is cached then) or a URI of another scheme."""
    location = commit_file_location(root, version)
    if is_object_store(root):
        return object_stamp(location)
    if "://" in root:
        return None
    try:
        stat = os.stat(location)
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def newest_commit(root: str, version: int) -> tuple[CommitStamp | None, bool]:
    """``version``'s commit stamp and whether a later version's commit file exists: a stat
    of each locally, one listing (of at most two names, from ``version``'s commit file on)
    on an object store."""
    if not is_object_store(root):
        return commit_stamp(root, version), os.path.exists(commit_file_location(root, version + 1))
    name = f"{version:020d}.json"
    # ".j" sorts just before ".json" and after ".checkpoint..." and ".crc" of the version.
    listed = objects_after(f"{root.rstrip('/')}/_delta_log/", f"{version:020d}.j", 2)
    stamp = next((found for key, found in listed if key == name), None)
    newer = any(key[:20].isdigit() and int(key[:20]) > version for key, _ in listed)
    return stamp, newer


class VersionCache(Generic[Value]):
    """At most ``capacity`` values by (table root, version), least recently used dropped.
    Safe to share between threads (the engines of one process share their caches)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a version cache holds at least one entry; capacity {capacity}")
        self._capacity = capacity
        self._lock = threading.RLock()
        # (root, version) -> (its commit file's stamp, version 0's stamp then, value)
        self._entries: OrderedDict[
            tuple[str, int], tuple[CommitStamp, CommitStamp | None, Value]
        ] = OrderedDict()

    def get(self, root: str, version: int) -> Value | None:
        with self._lock:
            entry = self._entries.get((root, version))
            if entry is None:
                return None
            stamp, _, value = entry
            if commit_stamp(root, version) != stamp:
                del self._entries[(root, version)]
                return None
            self._entries.move_to_end((root, version))
            return value

    def get_many(self, root: str, versions: range) -> list[Value | None]:
        """:meth:`get` of each of ``versions``, checking one commit file for all of them
        (version 0's: the table is the one the entries were built from) where it can; an
        entry put before that file changed, or while it was gone (log retention), is
        checked on its own. A stat per version cost admission 1.8 ms a step."""
        with self._lock:
            first = commit_stamp(root, 0)
            found: list[Value | None] = []
            for version in versions:
                entry = self._entries.get((root, version))
                if entry is not None and first is not None and entry[1] == first:
                    self._entries.move_to_end((root, version))
                    found.append(entry[2])
                else:
                    found.append(self.get(root, version))
            return found

    def put(self, root: str, version: int, value: Value) -> None:
        with self._lock:
            stamp = commit_stamp(root, version)
            if stamp is None:
                return
            first = stamp if version == 0 else commit_stamp(root, 0)
            self._entries[(root, version)] = (stamp, first, value)
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def drop_table(self, root: str) -> None:
        """Forget every entry of ``root`` (a caller that keeps only the newest one)."""
        with self._lock:
            for key in [key for key in self._entries if key[0] == root]:
                del self._entries[key]

    def holds(self, root: str) -> bool:
        """Whether some entry of ``root`` is still valid (its commit file is still the file
        it was built from): the table exists."""
        with self._lock:
            return any(
                self.get(r, v) is not None
                for r, v in [key for key in self._entries if key[0] == root]
            )

    def latest(self, root: str) -> Value | None:
        """The entry of ``root``'s newest version when that is still the table's latest
        (the next version's commit file does not exist), else None."""
        with self._lock:
            if "://" in root and not is_object_store(root):
                return None
            versions = [v for r, v in self._entries if r == root]
            if not versions:
                return None
            newest = max(versions)
            stamp, newer = newest_commit(root, newest)
            if newer:
                return None
            held, _, value = self._entries[(root, newest)]
            if stamp != held:
                del self._entries[(root, newest)]
                return None
            self._entries.move_to_end((root, newest))
            return value

    def latest_before(self, root: str, version: int) -> tuple[int, Value] | None:
        """The newest still-valid entry of ``root`` below ``version``, for building the
        version from it and the commits in between."""
        with self._lock:
            below = sorted((v for r, v in self._entries if r == root and v < version), reverse=True)
            for candidate in below:
                value = self.get(root, candidate)
                if value is not None:
                    return candidate, value
            return None
