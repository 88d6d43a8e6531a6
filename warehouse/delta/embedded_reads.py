"""The embedded engine's reads: snapshots of table versions, their file actions, and the
rows of their data files into Spark or Arrow.

A version's snapshot is listed by delta-rs once and kept (``version_cache``); a version
after one already held is replayed from it and the commit files in between
(``log_replay``), not opened and listed again: following a stream table takes a small read
per new commit. Whatever the replay does not model (a schema or protocol change, a
timestamp partition, a commit file log retention removed) is listed by delta-rs as before.
Data files are read by Spark (:func:`read_files`) or, in the driver, by pyarrow
(:func:`arrow_of_files`); partition values come from the log, not the paths.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from common.errors import DeltaTableError
from warehouse.delta.added_files import FileAction
from warehouse.delta.added_rows import require_version_range
from warehouse.delta.api import COMMIT_VERSION, DataFile, RowMask, Snapshot
from warehouse.delta.embedded_tip import REPLAYED_COMMITS, TableTips
from warehouse.delta.engine import FileActions
from warehouse.delta.file_stats import column_bounds
from warehouse.delta.log_replay import replay_actions
from warehouse.delta.partition_paths import normalised_location, uri_suffix_keys
from warehouse.delta.schema import arrow_to_spark, spark_to_arrow
from warehouse.delta.table_paths import data_file_location, table_root
from warehouse.delta.version_cache import VersionCache
from warehouse.object_store import filesystem_of

logger = logging.getLogger(__name__)

_FILE_KEY = "__source_file"


class Snapshots:
    """Table versions as snapshots, by (root, version): a version of a table never changes,
    so the log is read and decoded once per version (an SSBJ step asks for the same pinned
    versions several times); see warehouse.delta.version_cache."""

    def __init__(self, cache: VersionCache[Snapshot], tips: TableTips) -> None:
        self.cache = cache
        self.tips = tips

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        root = table_root(path)
        if timestamp is None:
            if version is None:
                version = self.tips.tip(root).table_version
            known = self.cache.get(root, version)
            if known is not None:
                return known
            replayed = self.replayed(root, version)
            if replayed is not None:
                return replayed
            tip = self.tips.cache.get(root, version)
            if tip is not None and tip.handle.version() == version:
                table = tip.handle  # the held handle is at this version: no open
            else:
                table = self.tips.open(root, version)
        else:
            table = self.tips.open(root, held=False)
            table.load_as_version(timestamp)
            known = self.cache.get(root, table.version()) or self.replayed(root, table.version())
            if known is not None:  # already listed, or replayed from a listed version
                return known
        snapshot = self.snapshot_of(root, table)
        self.cache.put(root, snapshot.version, snapshot)
        return snapshot

    def replayed(self, root: str, version: int) -> Snapshot | None:
        """``version`` from the newest earlier version this engine holds and the commit
        files in between (``log_replay``), each version on the way kept as well; None where
        that does not apply: no earlier version within :data:`REPLAYED_COMMITS`, a commit
        file gone (log retention), or an action the replay does not model (a schema or
        protocol change, say). A commit file is a small read; opening the version in
        delta-rs and listing its files cost 12 ms and more per version on a log of 1,400
        files (an SSBJ step's input spans 6-7 bronze versions)."""
        base = self.cache.latest_before(root, version)
        if base is None or version - base[0] > REPLAYED_COMMITS:
            return None
        base_version, snapshot = base
        for between in range(base_version + 1, version + 1):
            try:
                commit = self.tips.commit(root, between)
            except (OSError, ValueError):
                return None
            files = replay_actions(
                root,
                {f.path: f for f in snapshot.files},
                [commit.actions],
                snapshot.schema,
                snapshot.partition_columns,
                {},  # no column mapping: require_readable refuses it
                by_location=True,
            )
            if files is None:
                return None
            snapshot = replace(snapshot, version=between, files=tuple(files.values()))
            self.cache.put(root, between, snapshot)
        return snapshot

    def snapshot_of(self, root: str, table: DeltaTable, with_files: bool = True) -> Snapshot:
        """``table``'s version as a Snapshot; without ``with_files``, its definition only
        (schema, partitioning, properties: no file listing)."""
        metadata = table.metadata()
        partitions = tuple(metadata.partition_columns)
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist() if with_files else []
        schema = arrow_to_spark(table.schema().to_arrow())
        files = tuple(
            DataFile(
                path=data_file_location(root, action["path"]),
                size_bytes=int(action["size_bytes"]),
                num_records=action.get("num_records"),
                partition_values={c: action.get(f"partition.{c}") for c in partitions},
                bounds=column_bounds(
                    schema,
                    {c: action.get(f"min.{c}") for c in schema.fieldNames()},
                    {c: action.get(f"max.{c}") for c in schema.fieldNames()},
                ),
                log_path=action["path"],  # delta-rs lists the log's path text
            )
            for action in actions
        )
        return Snapshot(
            table_path=root,
            version=table.version(),
            schema=schema,
            partition_columns=partitions,
            files=files,
            properties={k: v for k, v in metadata.configuration.items() if v is not None},
        )

    def definition(self, root: str) -> Snapshot:
        """The latest version's schema, partitioning and properties, without listing its
        files (a table a step appends to is checked every step)."""
        tip = self.tips.tip(root)
        known = self.cache.get(root, tip.table_version)
        if known is not None:
            return known
        return Snapshot(
            table_path=root,
            version=tip.table_version,
            schema=tip.schema,
            partition_columns=tip.partition_columns,
            files=(),
            properties=dict(tip.properties),
        )

    def file_actions(self, root: str, after_version: int, to_version: int) -> FileActions[DataFile]:
        """(version, adds, removes) of each version in (after, to].

        The files come from consecutive snapshots (typed partition values, as reads need
        them; each replayed from the one before where :meth:`replayed` applies); which of
        their adds and removes change data comes from the version's commit file. A commit
        file already cleaned up by log retention counts every action as a data change, as
        the snapshots alone would say.
        """
        require_version_range(f"changes of {root}", after_version, to_version)
        previous = {f.path: f for f in self.snapshot(root, after_version).files}
        for version in range(after_version + 1, to_version + 1):
            current = {f.path: f for f in self.snapshot(root, version).files}
            quiet = self.no_data_change(root, version)
            adds = [
                FileAction(p, _partition_key(f), p not in quiet, f)
                for p, f in current.items()
                if p not in previous
            ]
            removes = [
                FileAction(p, _partition_key(f), p not in quiet, f)
                for p, f in previous.items()
                if p not in current
            ]
            yield version, adds, removes
            previous = current

    def no_data_change(self, root: str, version: int) -> frozenset[str]:
        """The file locations one commit adds or removes with ``dataChange=false``."""
        try:
            quiet = self.tips.commit(root, version).quiet_paths
        except FileNotFoundError:
            logger.warning(
                "%s: the commit file of version %d is gone (log retention); its adds and "
                "removes are taken as data changes",
                root,
                version,
            )
            return frozenset()
        return frozenset(data_file_location(root, path) for path in quiet)

    def rows_by_version(
        self, root: str, after_version: int, to_version: int
    ) -> list[tuple[int, int]]:
        """From each version's commit file: one small read per version, where replaying
        snapshots would cost a file listing each. A commit file already cleaned up by log
        retention falls back to the snapshots."""
        versions = range(after_version + 1, to_version + 1)
        try:
            return [
                (version, (known or self.tips.commit(root, version)).rows_added)
                for version, known in zip(
                    versions, self.tips.commits.get_many(root, versions), strict=True
                )
            ]
        except FileNotFoundError:
            return [
                (
                    version,
                    sum(a.payload.num_records or 0 for a in adds if a.data_change and a.payload),
                )
                for version, adds, _ in self.file_actions(root, after_version, to_version)
            ]


def read_files(
    spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile] | None = None
) -> DataFrame:
    """The rows of ``files`` (all of the snapshot's by default) with the snapshot's schema.

    Partition values come from the log, not the paths. Files of one partition (a scan
    partition of SSBJ's copy, an interval of an output) are read with its values as
    literals: no Spark job beyond the scan. Files of more partitions are joined to a
    broadcast lookup of their values by file, so the plan stays one scan however many
    partitions are read (a scan per partition, with literals, was tried: about 0.25 s
    of planning each, more than the broadcast job it saves, measured on the audit's
    read of the published table). The lookup's key is the shortest tail of the file's
    URI that tells the files apart (``partition_paths.uri_suffix_keys``), so a row pays
    a substring, not a decoding of its file's path: a count of 2.2M rows of an SSBJ
    output over 7 intervals took 7.4 s with the decoding and 1.0 s with the tail."""
    chosen = snapshot.files if files is None else tuple(files)
    columns = snapshot.schema.fieldNames()
    if not chosen:
        return spark.createDataFrame([], snapshot.schema)
    partitions = snapshot.partition_columns
    data_schema = StructType([f for f in snapshot.schema.fields if f.name not in partitions])
    frame = spark.read.schema(data_schema).parquet(*[f.path for f in chosen])
    if not partitions:
        return frame.select(*columns)
    distinct = {tuple(f.partition_values.get(c) for c in partitions) for f in chosen}
    if len(distinct) == 1:
        (values,) = distinct
        literals = [
            F.lit(value).cast(snapshot.schema[c].dataType).alias(c)
            for c, value in zip(partitions, values, strict=True)
        ]
        return frame.select(*[F.col(f.name) for f in data_schema.fields], *literals).select(
            *columns
        )
    lookup_schema = StructType(
        [StructField(_FILE_KEY, StringType(), False)] + [snapshot.schema[c] for c in partitions]
    )
    suffixes = uri_suffix_keys(frame.inputFiles(), [f.path for f in chosen])
    if suffixes is not None:
        # A row's key is the tail of its file's URI as Spark writes it: no per-row
        # decoding (url_decode and a regex over 2.2M rows made a count 8x slower).
        depth, keys = suffixes
        row_key = F.substring_index(F.col("_metadata.file_path"), "/", -depth)
    else:
        keys = [normalised_location(f.path) for f in chosen]
        row_key = _decoded_file_location()
    lookup = spark.createDataFrame(
        [
            (key, *[f.partition_values.get(c) for c in partitions])
            for key, f in zip(keys, chosen, strict=True)
        ],
        lookup_schema,
    )
    return (
        frame.withColumn(_FILE_KEY, row_key).join(F.broadcast(lookup), _FILE_KEY).select(*columns)
    )


def change_feed(
    spark: SparkSession, table: DeltaTable, after_version: int, to_version: int, schema: StructType
) -> DataFrame:
    """delta-rs's ``load_cdf`` of ``table`` (a handle at ``to_version``), in the driver's
    memory, handed to Spark."""
    feed = pa.RecordBatchReader.from_stream(
        table.load_cdf(starting_version=after_version + 1, ending_version=to_version)
    ).read_all()
    # delta-rs answers with view and unsigned types that Spark cannot convert.
    target = spark_to_arrow(schema)
    return spark.createDataFrame(feed.select(target.names).cast(target), schema)


def arrow_by_version(
    snapshot: Snapshot, by_version: Mapping[int, Sequence[DataFile]], with_version: bool
) -> pa.Table:
    """The rows of the files each version added, as of ``snapshot`` (the range's end);
    with ``with_version``, each row tagged with the version that added its file."""
    if not with_version:
        return arrow_of_files(snapshot, [f for files in by_version.values() for f in files])
    schema = spark_to_arrow(snapshot.schema).append(pa.field(COMMIT_VERSION, pa.int64()))
    parts = []
    for version, files in by_version.items():
        rows = arrow_of_files(snapshot, files)
        parts.append(
            rows.append_column(COMMIT_VERSION, pa.repeat(pa.scalar(version, pa.int64()), len(rows)))
        )
    return pa.concat_tables(parts).cast(schema) if parts else schema.empty_table()


def arrow_of_files(
    snapshot: Snapshot,
    files: Sequence[DataFile],
    columns: Sequence[str] | None = None,
    where: RowMask | None = None,
) -> pa.Table:
    """The rows of ``files`` of ``snapshot`` (``columns`` of them, all by default, in that
    order) that ``where`` keeps, each file filtered as it is read, with the snapshot's
    Arrow types; partition values come from the log, and a column added to the table after
    a file was written reads as nulls there."""
    full = spark_to_arrow(snapshot.schema)
    names = list(full.names if columns is None else columns)
    unknown = [c for c in names if c not in full.names]
    if unknown:
        raise DeltaTableError(
            f"read of {snapshot.table_path} v{snapshot.version}: no column(s) {unknown}; "
            f"it has {full.names}"
        )
    schema = pa.schema([full.field(c) for c in names])
    stored = [c for c in names if c not in snapshot.partition_columns]
    parts = []
    for file in files:
        filesystem, located = filesystem_of(file.path)
        with filesystem.open_input_file(located) as handle:
            parquet = pq.ParquetFile(handle)
            present = set(parquet.schema_arrow.names)
            data = parquet.read(columns=[c for c in stored if c in present])
            rows = parquet.metadata.num_rows
        out = []
        for field in schema:
            if field.name in snapshot.partition_columns:
                value = file.partition_values.get(field.name)
                out.append(pa.repeat(pa.scalar(value, type=field.type), rows))
            elif field.name in data.column_names:
                column = data.column(field.name)  # a cast to its own type would copy it
                out.append(column if column.type == field.type else column.cast(field.type))
            else:  # a column added to the table after this file was written
                out.append(pa.nulls(rows, type=field.type))
        part = pa.table(out, schema=schema)
        parts.append(part if where is None else part.filter(where(part)))
    if not parts:
        return schema.empty_table()
    return pa.concat_tables(parts)


def _decoded_file_location() -> Column:
    # Spark reports the file as an RFC 2396 URI; '+' is literal there, so protect it before
    # url_decode (which would read it as a space), then drop the scheme like the Python side.
    decoded = F.url_decode(F.replace(F.col("_metadata.file_path"), F.lit("+"), F.lit("%2B")))
    return F.concat(F.lit("/"), F.regexp_replace(decoded, r"^[A-Za-z][A-Za-z0-9+.-]*:/*", ""))


def _partition_key(file: DataFile) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(file.partition_values.items()))
