"""A table version's live files from an earlier version's files and the commits in between.

The Delta protocol defines a version's state as the reconciliation of every action up to it:
a file is live when its last ``add`` is not followed by a ``remove`` of the same path (and
deletion vector). So version ``w`` is version ``v``'s live files with the ``add`` and
``remove`` actions of commits ``v+1..w`` applied in order. The native engine uses this to
build the snapshot after each of its own commits from the one before, in Python, instead of
a Spark job over the whole log; anything this replay does not model returns ``None`` and the
caller builds the snapshot the full way:

- a ``metaData`` or ``protocol`` action (the schema, partitioning or features may change);
- a deletion vector on any action (files are then keyed by path and vector, and rows hidden);
- a ``remove`` of a path that is not live (the caller's base is not what it thinks);
- a partition value of a type whose text form this module does not parse the way Spark's
  cast does (only strings, integers, booleans and dates are parsed here);
- an action this module does not know.

``txn``, ``commitInfo``, ``cdc`` and ``domainMetadata`` actions do not change the live files.

Invariant: when :func:`replay` returns files, they are exactly the live files of the last
commit given, with the partition values and statistics the full build reads from the log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DataType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from warehouse.delta.api import DataFile
from warehouse.delta.file_stats import column_bounds
from warehouse.delta.table_paths import data_file_location

# Actions that leave the set of live files as it is.
_NEUTRAL_ACTIONS = frozenset({"txn", "commitInfo", "cdc", "domainMetadata"})
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_INTEGER_BITS = {ByteType: 8, ShortType: 16, IntegerType: 32, LongType: 64}
_INTEGER = re.compile(r"-?[0-9]+")


class _UnmodelledError(Exception):
    """An action or value this replay does not model: build the snapshot the full way."""


def replay(
    root: str,
    live: Mapping[str, DataFile],
    commits: Sequence[str],
    schema: StructType,
    partitions: Sequence[str],
    physical: Mapping[str, str],
    *,
    by_location: bool = False,
) -> dict[str, DataFile] | None:
    """``live`` (the earlier version's files by their log path) with ``commits`` (the JSON
    text of each later commit file, in version order) applied; None if a commit holds
    anything this module does not model (see the module docstring).

    With ``by_location``, ``live`` and the answer are keyed by each file's location
    (``DataFile.path``) instead: for an engine whose snapshots do not keep the log's
    path text."""
    parsed = [[json.loads(line) for line in text.splitlines() if line.strip()] for text in commits]
    return replay_actions(root, live, parsed, schema, partitions, physical, by_location=by_location)


def replay_actions(
    root: str,
    live: Mapping[str, DataFile],
    commits: Sequence[Sequence[Mapping[str, Any]]],
    schema: StructType,
    partitions: Sequence[str],
    physical: Mapping[str, str],
    *,
    by_location: bool = False,
) -> dict[str, DataFile] | None:
    """:func:`replay` of commits already parsed (each a sequence of actions)."""
    files = dict(live)
    try:
        for actions in commits:
            for action in actions:
                _apply(root, files, action, schema, partitions, physical, by_location)
    except _UnmodelledError:
        return None
    return files


def _apply(
    root: str,
    files: dict[str, DataFile],
    action: Mapping[str, Any],
    schema: StructType,
    partitions: Sequence[str],
    physical: Mapping[str, str],
    by_location: bool,
) -> None:
    if len(action) != 1:
        raise _UnmodelledError(f"an action with {len(action)} keys")
    (kind, body), *_ = action.items()
    if kind in _NEUTRAL_ACTIONS:
        return
    if kind not in ("add", "remove") or body.get("deletionVector"):
        raise _UnmodelledError(kind)
    log_path = str(body["path"])
    path = data_file_location(root, log_path) if by_location else log_path
    if kind == "remove":
        if path not in files:
            raise _UnmodelledError(f"remove of {path}, which is not live")
        del files[path]
        return
    raw_values = body.get("partitionValues") or {}
    stats = body.get("stats")
    document = json.loads(stats) if stats else {}
    records = document.get("numRecords")
    low, high = document.get("minValues") or {}, document.get("maxValues") or {}
    files[path] = DataFile(
        path=data_file_location(root, log_path),
        size_bytes=int(body["size"]),
        num_records=int(records) if records is not None else None,
        partition_values={
            c: _partition_value(raw_values.get(physical.get(c, c)), schema[c].dataType)
            for c in partitions
        },
        bounds=column_bounds(
            schema,
            {c: low.get(physical.get(c, c)) for c in schema.fieldNames()},
            {c: high.get(physical.get(c, c)) for c in schema.fieldNames()},
        )
        if stats
        else {},
        log_path=log_path,
    )


def _partition_value(text: str | None, data_type: DataType) -> Any:
    """A partition value as the full build types it (Spark's cast of the log's text). An
    empty string is null, of any type: delta-rs and delta-spark both read it so (a Hive
    partition directory cannot hold an empty value)."""
    if text is None or text == "":
        return None
    if isinstance(data_type, StringType):
        return text
    if isinstance(data_type, _INTEGRAL) and _INTEGER.fullmatch(text):
        value = int(text)
        bits = _INTEGER_BITS[type(data_type)]
        if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
            return value
        raise _UnmodelledError(f"{data_type.simpleString()} partition value {text!r}")
    if isinstance(data_type, BooleanType) and text in ("true", "false"):
        return text == "true"
    if isinstance(data_type, DateType) and len(text) == 10:
        try:
            return date.fromisoformat(text)
        except ValueError as e:
            raise _UnmodelledError(f"date partition value {text!r}") from e
    raise _UnmodelledError(f"partition value {text!r} of type {data_type.simpleString()}")
