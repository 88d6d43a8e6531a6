"""Refusal of Delta tables whose reader features the embedded engine cannot honour.

The embedded engine reads a snapshot by listing its Parquet files and reading them with
Spark. That returns exactly the table's rows only while the table needs no reader feature
that changes what a data file means:

- ``deletionVectors``: deleted rows stay in the Parquet files, masked by deletion-vector
  files; a file-list read would return them. delta-rs 1.6 does not expose which files carry
  a deletion vector (and its own reader refuses such tables), so a table with the feature is
  refused as a whole.
- ``columnMapping`` (reader version 2, or ``delta.columnMapping.mode`` other than ``none``):
  Parquet columns carry physical names (``col-<uuid>``) or ids, not the table's column
  names; a by-name read returns nulls.
- any other reader feature not known to be safe for a file-list read.

Such tables are refused before any file is read, naming each feature and the engine that
reads them: the native engine (delta-spark) honours all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.errors import UnsupportedTableFeatureError

SAFE_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
MAX_SAFE_READER_VERSION_WITHOUT_FEATURES = 1

WHY_UNREADABLE = {
    "deletionVectors": "deleted rows stay in its Parquet files, masked by deletion vectors",
    "columnMapping": "its Parquet columns carry physical names, not the table's column names",
}

NATIVE_ENGINE_HINT = (
    "the native engine (delta-spark: `warehouse.engine: native`, with the "
    "delta-spark jars that `make jars` fetches) reads it"
)


def unreadable_features(
    min_reader_version: int,
    reader_features: Iterable[str] | None,
    configuration: Mapping[str, str | None],
) -> list[str]:
    """The reader features of a table that a plain file-list read would get wrong."""
    features = sorted(reader_features or [])
    unsupported = [f for f in features if f not in SAFE_READER_FEATURES]
    mapping_mode = (configuration.get("delta.columnMapping.mode") or "none").lower()
    if mapping_mode != "none" and "columnMapping" not in unsupported:
        unsupported.append("columnMapping")
    if min_reader_version == 2 and not features and "columnMapping" not in unsupported:
        # Reader version 2 exists only for column mapping.
        unsupported.append("columnMapping")
    return sorted(set(unsupported))


def require_readable(
    table_path: str,
    min_reader_version: int,
    reader_features: Iterable[str] | None,
    configuration: Mapping[str, str | None],
) -> None:
    """Raise unless a plain file-list read of this table returns exactly its rows."""
    unsupported = unreadable_features(min_reader_version, reader_features, configuration)
    if not unsupported:
        return
    reasons = "; ".join(
        f"{feature}: {WHY_UNREADABLE.get(feature, 'a reader feature it does not implement')}"
        for feature in unsupported
    )
    raise UnsupportedTableFeatureError(
        f"table {table_path} needs reader feature(s) {unsupported} (reader version "
        f"{min_reader_version}), which the embedded engine cannot read ({reasons}); it "
        f"reads only tables whose reader features are among {sorted(SAFE_READER_FEATURES)}. "
        f"Refused rather than return wrong rows: {NATIVE_ENGINE_HINT}, or rewrite the "
        "table without these features (REORG TABLE ... APPLY (PURGE) removes deletion "
        "vectors)."
    )
