"""The DataFrames of ``changes`` and ``rows_added``, built from the files each version added.

Both engines answer these two calls the same way once they know, per version, which files
it added and removed (:mod:`warehouse.delta.added_files`): each version's files are read as
one DataFrame, tagged with the version (and, for ``changes``, the kind of change), and the
parts are unioned. Only the read of a list of files is the engine's own (Spark's Parquet
reader over the log's file list, or delta-spark's reader with deletion vectors applied), so
it is passed in; the schemas, the append-only rule of ``changes`` without a change data
feed, and the union live here once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from common.errors import DeltaTableError, NotAppendOnlyError
from warehouse.delta.added_files import FileAction
from warehouse.delta.api import CDF_PROPERTY, CHANGE_TYPE, COMMIT_VERSION, INSERT, Snapshot

Payload = TypeVar("Payload")


def require_version_range(subject: str, after_version: int, to_version: int) -> None:
    """Refuse a range ``(after_version, to_version]`` that runs backwards."""
    if to_version < after_version:
        raise DeltaTableError(
            f"{subject}: to_version {to_version} is before after_version {after_version}"
        )


def change_schema(schema: StructType) -> StructType:
    """The rows ``changes`` returns: the table's columns, the kind of change, the version."""
    return StructType(
        [
            *schema.fields,
            StructField(CHANGE_TYPE, StringType(), False),
            StructField(COMMIT_VERSION, LongType(), False),
        ]
    )


def change_feed_enabled(snapshot: Snapshot) -> bool:
    """Whether the table records its changes (Delta's change data feed) at ``snapshot``."""
    return snapshot.properties.get(CDF_PROPERTY, "false").lower() == "true"


def appended_changes(
    spark: SparkSession,
    root: str,
    commits: Iterable[tuple[int, Sequence[FileAction[Payload]], Sequence[FileAction[Payload]]]],
    read: Callable[[list[Payload]], DataFrame],
    schema: StructType,
) -> DataFrame:
    """``changes`` of a table without a change data feed: every row of a file added with
    ``dataChange=true`` is an ``INSERT`` of its version, read with ``read``; ``schema`` is
    :func:`change_schema`'s.

    A removed row cannot be known from the files alone, so a commit that removed a file with
    ``dataChange=true`` raises :class:`NotAppendOnlyError`; a compaction's actions
    (``dataChange=false``) change no row.
    """
    parts: list[DataFrame] = []
    for version, adds, removes in commits:
        removed = [r for r in removes if r.data_change]
        if removed:
            raise NotAppendOnlyError(
                f"table {root} removed {len(removed)} file(s) in version {version} and "
                f"does not enable {CDF_PROPERTY}; its changes cannot be derived from added "
                f"files. Set {CDF_PROPERTY}=true on the table."
            )
        added = [a.payload for a in adds if a.data_change and a.payload is not None]
        if added:
            parts.append(
                read(added)
                .withColumn(CHANGE_TYPE, F.lit(INSERT))
                .withColumn(COMMIT_VERSION, F.lit(version).cast(LongType()))
            )
    return _union_or_empty(spark, parts, schema)


def rows_added_frame(
    spark: SparkSession,
    schema: StructType,
    by_version: Mapping[int, list[Payload]],
    read: Callable[[list[Payload]], DataFrame],
) -> DataFrame:
    """``rows_added``: the files ``by_version`` holds, read with ``read`` (the table's
    columns, ``schema``), each row with ``_commit_version``, the version that added it."""
    parts = [
        read(files).withColumn(COMMIT_VERSION, F.lit(version).cast(LongType()))
        for version, files in by_version.items()
    ]
    return _union_or_empty(
        spark, parts, StructType([*schema.fields, StructField(COMMIT_VERSION, LongType())])
    )


def _union_or_empty(
    spark: SparkSession, parts: Sequence[DataFrame], schema: StructType
) -> DataFrame:
    """The union of ``parts`` by column name; an empty DataFrame of ``schema`` for none."""
    if not parts:
        return spark.createDataFrame([], schema)
    result = parts[0]
    for part in parts[1:]:
        result = result.unionByName(part)
    return result
