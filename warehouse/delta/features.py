"""Refusal of Delta tables whose reader features this product cannot honour.

Reading a table with deletion vectors or column mapping by listing its Parquet files would
return deleted rows or wrong column names. Such tables are refused before any file is read.
Only reader features known to be safe for a file-list read are allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from common.errors import UnsupportedTableFeatureError

SAFE_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
MAX_SAFE_READER_VERSION_WITHOUT_FEATURES = 1


def require_readable(
    table_path: str,
    min_reader_version: int,
    reader_features: Iterable[str] | None,
    configuration: Mapping[str, str | None],
) -> None:
    """Raise unless a plain file-list read of this table returns exactly its rows."""
    features = sorted(reader_features or [])
    unsupported = [f for f in features if f not in SAFE_READER_FEATURES]
    mapping_mode = (configuration.get("delta.columnMapping.mode") or "none").lower()
    if mapping_mode != "none" and "columnMapping" not in unsupported:
        unsupported.append("columnMapping")
    if min_reader_version == 2 and not features:
        # Reader version 2 exists only for column mapping.
        unsupported.append("columnMapping")
    if unsupported:
        raise UnsupportedTableFeatureError(
            f"table {table_path} needs reader features {sorted(set(unsupported))} "
            f"(reader version {min_reader_version}); this engine supports only "
            f"{sorted(SAFE_READER_FEATURES)}. Reading its Parquet files directly would "
            "return wrong rows, so it is refused; read it with delta-spark instead, or "
            "rewrite it without these features (e.g. REORG TABLE ... APPLY (PURGE))."
        )
