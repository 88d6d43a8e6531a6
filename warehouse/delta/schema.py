"""Schema conversion between Spark, Arrow and Delta, and the append schema guard.

delta-rs 1.6 does not check the schema of files committed through
``create_write_transaction``, so every write path calls :func:`require_same_schema` first.
Columns are matched by name; a difference in the set of names or in any column's type is
refused with a message that lists each offending column with both types. The checks of a
new table's partition columns and of a merge's source, the same for both engines, are here
too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from warehouse.delta.api import Snapshot

from common.errors import DeltaTableError, SchemaMismatchError, TableExistsError


def spark_to_arrow(schema: StructType) -> pa.Schema:
    """Arrow schema for Delta: timestamps become ``timestamp[us, UTC]`` as the protocol wants."""
    arrow = to_arrow_schema(schema, timestamp_utc=True)
    return pa.schema(
        [
            f.with_type(pa.timestamp("us", tz=f.type.tz)) if pa.types.is_timestamp(f.type) else f
            for f in arrow
        ]
    )


def arrow_to_spark(schema: Any) -> StructType:
    """Spark schema of an Arrow (or arro3) schema."""
    return from_arrow_schema(pa.schema(schema))


def require_same_schema(table_path: str, table: StructType, data: StructType) -> None:
    """Raise :class:`SchemaMismatchError` unless ``data`` has exactly the table's columns."""
    table_types = {f.name: f.dataType.simpleString() for f in table.fields}
    data_types = {f.name: f.dataType.simpleString() for f in data.fields}
    missing = [n for n in table_types if n not in data_types]
    unexpected = [n for n in data_types if n not in table_types]
    changed = [n for n in table_types if n in data_types and table_types[n] != data_types[n]]
    if not (missing or unexpected or changed):
        return
    lines = [f"write to {table_path} refused: the data's schema does not match the table's"]
    if missing:
        lines.append("  missing columns: " + ", ".join(f"{n} ({table_types[n]})" for n in missing))
    if unexpected:
        lines.append(
            "  unexpected columns: " + ", ".join(f"{n} ({data_types[n]})" for n in unexpected)
        )
    for n in changed:
        lines.append(f"  column {n}: table has {table_types[n]}, data has {data_types[n]}")
    raise SchemaMismatchError("\n".join(lines))


def require_partition_columns(
    table_path: str, schema: StructType, partition_by: Sequence[str]
) -> None:
    """Refuse to create a table partitioned by columns its schema does not have."""
    unknown = [c for c in partition_by if c not in schema.fieldNames()]
    if unknown:
        raise DeltaTableError(
            f"partition columns {unknown} of {table_path} are not in the schema "
            f"{schema.fieldNames()}"
        )


def require_merge_source(
    table_path: str,
    table: StructType,
    source: DataFrame,
    keys: Sequence[str],
    delete_flag: str | None,
) -> None:
    """Refuse a merge source that is not the table's columns (plus ``delete_flag``), or a
    merge without keys."""
    payload = source.drop(delete_flag) if delete_flag else source
    require_same_schema(table_path, table, payload.schema)
    if not keys:
        raise DeltaTableError(f"merge into {table_path} needs at least one key column")


def require_same_definition(
    existing: Snapshot, schema: StructType, partition_by: Sequence[str]
) -> int:
    """Accept an existing table only if its schema and partitioning are the ones asked for."""
    require_same_schema(existing.table_path, existing.schema, schema)
    if tuple(partition_by) != existing.partition_columns:
        raise TableExistsError(
            f"table {existing.table_path} exists partitioned by "
            f"{list(existing.partition_columns)}, expected {list(partition_by)}"
        )
    return existing.version
