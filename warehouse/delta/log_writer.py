"""A commit to a local Delta table written as its commit file, without delta-rs.

delta-rs's commit (``create_write_transaction``) costs 6-7 ms on a table of a few dozen
files, and the handle it was made on must then be moved to the new version (another 4-6
ms) before the next write can use it: 20 ms of an SSBJ step's 100 ms go to its two commits.
A commit is only a file (Delta protocol, "Delta Log Entries"): one JSON action per line,
made visible at ``_delta_log/<version>.json`` by an atomic create-if-absent. Writing it
takes a fraction of a millisecond, and the engine knows the new version from the actions
it wrote.

This module writes only what delta-rs's append and partition overwrite write (commitInfo,
add, remove, txn) and only where the protocol lets a writer do so without honouring a
feature: :func:`writable` names what stops it otherwise, and the engine then commits
through delta-rs as before.

Invariants:

- :func:`write_commit` makes ``version`` visible with exactly the given actions, or
  returns False and leaves the log as it was when ``version`` exists already (another
  writer took it): the file appears whole or not at all (a hard link of a complete
  temporary file, which fails when the name exists; no reader sees a partial file).
- The actions reference files by the paths their adds had in the log, so delta-rs and
  delta-spark reconcile a remove with its add.
- Durable: the commit file and the log folder's entry are fsynced, and the engine fsyncs
  the data files a commit adds before it commits (:func:`sync_files`), so a commit that
  survives a machine crash never names a file that did not.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

# Writer versions up to 2 need a writer to honour only ``delta.appendOnly`` and column
# invariants (Delta protocol, "Writer Version Requirements"); from 3 on, check constraints,
# generated columns, change data files, column mapping, identity columns or table features.
MAX_WRITER_VERSION = 2
APPEND_ONLY_PROPERTY = "delta.appendOnly"
INVARIANTS_KEY = "delta.invariants"
ENGINE_INFO = "enrichment-log-writer"


@dataclass(frozen=True)
class LogFile:
    """A live data file as a remove must name it: its path as the log's add wrote it, its
    partition values as the log's strings, and its size."""

    log_path: str
    partition_values: Mapping[str, str | None]
    size: int


def writable(
    root: str,
    min_writer_version: int,
    writer_features: Sequence[str] | None,
    configuration: Mapping[str, str | None],
    schema_json: str,
    removes: bool,
) -> str | None:
    """Why this module must not write a commit of this table (None: it may). ``removes``:
    whether the commit removes files."""
    if "://" in root:
        return "not a local table (an object store needs its own conditional put)"
    if min_writer_version > MAX_WRITER_VERSION or writer_features:
        return (
            f"writer version {min_writer_version} with features {sorted(writer_features or [])}"
            f" (at most {MAX_WRITER_VERSION}, none, are written here)"
        )
    if INVARIANTS_KEY in schema_json:
        return "column invariants"
    if removes and (configuration.get(APPEND_ONLY_PROPERTY) or "").lower() == "true":
        return f"{APPEND_ONLY_PROPERTY}=true"
    return None


def log_path(relative: str) -> str:
    """The path text the log stores for a data file at ``relative`` under the root: RFC
    2396-encoded (a reader decodes it back to the file's name; a ``%`` the file's name
    holds, as escaped partition directories do, is written ``%25``)."""
    return quote(relative, safe="/=")


def add_action(
    relative: str,
    size: int,
    partition_values: Mapping[str, str | None],
    modification_time: int,
    stats: str | None,
) -> dict[str, Any]:
    """An add of a written data file with ``dataChange`` (``relative``: its path under the
    root, as the file system names it)."""
    return {
        "add": {
            "path": log_path(relative),
            "partitionValues": dict(partition_values),
            "size": int(size),
            "modificationTime": int(modification_time),
            "dataChange": True,
            "stats": stats,
        }
    }


def remove_action(file: LogFile, deletion_timestamp: int) -> dict[str, Any]:
    """A remove of a live file with ``dataChange`` (as delta-rs's overwrite writes it)."""
    return {
        "remove": {
            "path": file.log_path,
            "dataChange": True,
            "deletionTimestamp": int(deletion_timestamp),
            "extendedFileMetadata": True,
            "partitionValues": dict(file.partition_values),
            "size": int(file.size),
        }
    }


def txn_action(app_id: str, version: int, last_updated: int) -> dict[str, Any]:
    """The app transaction a commit records (idempotent writers, Delta protocol)."""
    return {"txn": {"appId": app_id, "version": int(version), "lastUpdated": int(last_updated)}}


def commit_info_action(
    timestamp: int,
    mode: str,
    partitions: Sequence[str],
    read_version: int,
    blind_append: bool,
    metadata: Mapping[str, str],
) -> dict[str, Any]:
    """The commitInfo of a write (``mode`` ``Append`` or ``Overwrite``), with the caller's
    metadata at its top level, as delta-rs records ``custom_metadata``."""
    return {
        "commitInfo": {
            "timestamp": int(timestamp),
            "operation": "WRITE",
            "operationParameters": {"mode": mode, "partitionBy": json.dumps(list(partitions))},
            "readVersion": int(read_version),
            "isBlindAppend": bool(blind_append),
            "engineInfo": ENGINE_INFO,
            **metadata,
        }
    }


def commit_text(actions: Sequence[Mapping[str, Any]]) -> str:
    """The commit file's text: one compact JSON action per line."""
    return "".join(json.dumps(action, separators=(",", ":")) + "\n" for action in actions)


def write_commit(root: str, version: int, actions: Sequence[Mapping[str, Any]]) -> bool:
    """Make ``version`` of the local table at ``root`` hold ``actions``; False, writing
    nothing, when that version exists already."""
    log = os.path.join(root, "_delta_log")
    target = os.path.join(log, f"{version:020d}.json")
    # delta-rs names its own temporary commit files so; readers skip them.
    staged = os.path.join(log, f"_commit_{uuid.uuid4()}.json.tmp")
    with open(staged, "x", encoding="utf-8") as handle:
        handle.write(commit_text(actions))
        handle.flush()
        os.fsync(handle.fileno())  # on disk before its name makes the version visible
    try:
        os.link(staged, target)  # fails when the name exists: put-if-absent
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):  # a stray temporary file is harmless
            os.unlink(staged)
    _sync_directory(log)  # the new name survives a power loss too
    return True


def sync_files(paths: Iterable[str]) -> None:
    """Flush local files and their folders' entries to disk: the data files a commit is
    about to reference must outlive a crash of the machine if the commit does."""
    folders = set()
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        folders.add(os.path.dirname(path))
    for folder in folders:
        _sync_directory(folder)


def _sync_directory(folder: str) -> None:
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
