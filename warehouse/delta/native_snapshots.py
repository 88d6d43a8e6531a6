"""The native engine's snapshots: a table version's files, schema and properties, built once.

A version's live files come from delta-spark's state of it (one Spark job) or, for a local
table, from an earlier version this engine built and the commit files in between (read as
files, no JVM). Snapshots are immutable per version, so they are cached by (table, table
id, version) and by (root, version).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from warehouse.delta.api import DataFile, Snapshot
from warehouse.delta.file_stats import column_bounds
from warehouse.delta.log_replay import replay
from warehouse.delta.native_jvm import NativeJvm
from warehouse.delta.table_paths import commit_file_location, data_file_location
from warehouse.delta.version_cache import VersionCache

# Field metadata delta-spark keeps in a table's schema (column mapping ids, physical names):
# not part of the columns' names or types, so left out of Snapshot.schema.
_DELTA_FIELD_METADATA_PREFIX = "delta."
_PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
SNAPSHOT_CACHE_SIZE = 64
# Most commits a snapshot is replayed over; beyond them delta-spark's checkpoint is cheaper.
_REPLAYED_COMMITS = 64


@dataclass(frozen=True)
class Pinned:
    """A snapshot this engine built, with the log's raw path of each of its files."""

    snapshot: Snapshot
    raw_paths: Mapping[str, str]
    physical: Mapping[str, str]  # each column's physical name (column mapping)


class NativeSnapshots(NativeJvm):
    """Snapshots built from delta-spark's state or replayed from earlier ones, cached."""

    # Snapshots are immutable per (table, table id, version): built once each.
    _pinned: OrderedDict[tuple[str, str, int], Pinned]
    # The same snapshots of local tables by (root, version), checked against their
    # commit file instead of the log: a pinned version is served without the JVM, and
    # a new version is replayed from an earlier one (warehouse.delta.log_replay).
    _by_version: VersionCache[Pinned]

    def _definition(self, root: str) -> Snapshot:
        """The latest version's schema, partitioning and properties, without its files (no
        Spark job): what accepting an existing table checks."""
        jsnap = self._jsnapshot(root)
        schema, partitions, _, properties = self._metadata(jsnap)
        return Snapshot(root, int(jsnap.version()), schema, partitions, (), properties)

    def _metadata(
        self, jsnap: Any
    ) -> tuple[StructType, tuple[str, ...], dict[str, str], dict[str, str]]:
        """A snapshot's logical schema, partition columns, physical names and properties."""
        metadata = jsnap.metadata()
        stored = StructType.fromJson(json.loads(jsnap.schema().json()))
        schema = logical_schema(stored)
        partitions = tuple(str(c) for c in self._java_list(metadata.partitionColumns()))
        # With column mapping, the log keys partition values and statistics by physical name.
        physical = {
            f.name: str((f.metadata or {}).get(_PHYSICAL_NAME_KEY, f.name)) for f in stored.fields
        }
        properties = {
            str(k): str(v)
            for k, v in self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
                metadata.configuration()
            ).items()
        }
        return schema, partitions, physical, properties

    def _pin(self, root: str, jsnap: Any) -> Pinned:
        version = int(jsnap.version())
        key = (root, str(jsnap.metadata().id()), version)
        pinned = self._pinned.get(key)
        if pinned is not None:
            self._pinned.move_to_end(key)
            return pinned
        pinned = self._replayed(root, version) or self._built(root, jsnap)
        self._pinned[key] = pinned
        while len(self._pinned) > SNAPSHOT_CACHE_SIZE:
            self._pinned.popitem(last=False)
        self._by_version.put(root, version, pinned)
        return pinned

    def _replayed(self, root: str, version: int) -> Pinned | None:
        """``version`` from the newest earlier version this engine built and the commits
        in between, read as files (no JVM); None where the replay does not apply."""
        base = self._by_version.latest_before(root, version)
        if base is None or version - base[0] > _REPLAYED_COMMITS:
            return None
        base_version, pinned = base
        commits = []
        for between in range(base_version + 1, version + 1):
            try:
                commit = Path(commit_file_location(root, between))
                commits.append(commit.read_text(encoding="utf-8"))
            except OSError:
                return None
        earlier = pinned.snapshot
        files = replay(
            root,
            {pinned.raw_paths[f.path]: f for f in earlier.files},
            commits,
            earlier.schema,
            earlier.partition_columns,
            pinned.physical,
        )
        if files is None:
            return None
        return Pinned(
            replace(earlier, version=version, files=tuple(files.values())),
            {f.path: raw for raw, f in files.items()},
            pinned.physical,
        )

    def _built(self, root: str, jsnap: Any) -> Pinned:
        """A snapshot from delta-spark's state of the version (one Spark job)."""
        schema, partitions, physical, properties = self._metadata(jsnap)
        adds = self._frame(jsnap.allFiles().toDF())
        live = adds.select(
            F.col("path"),
            F.col("size"),
            F.col("stats"),
            (
                F.get_json_object("stats", "$.numRecords").cast(LongType())
                - F.coalesce(F.col("deletionVector.cardinality"), F.lit(0))
            ).alias("records"),
            *[
                F.col("partitionValues")
                .getItem(physical[c])
                .cast(schema[c].dataType)
                .alias(f"partition_{i}")
                for i, c in enumerate(partitions)
            ],
        )
        rows = pa.table(live.toArrow()).to_pylist()
        raw_paths: dict[str, str] = {}
        files = []
        for row in rows:
            location = data_file_location(root, row["path"])
            raw_paths[location] = row["path"]
            files.append(
                DataFile(
                    path=location,
                    size_bytes=int(row["size"]),
                    num_records=row["records"],
                    partition_values={c: row[f"partition_{i}"] for i, c in enumerate(partitions)},
                    bounds=_file_bounds(schema, physical, row["stats"]),
                )
            )
        return Pinned(
            Snapshot(
                table_path=root,
                version=int(jsnap.version()),
                schema=schema,
                partition_columns=partitions,
                files=tuple(files),
                properties=properties,
            ),
            raw_paths,
            physical,
        )


def logical_schema(schema: StructType) -> StructType:
    """``schema`` without delta-spark's column-mapping field metadata."""
    return StructType(
        [
            StructField(
                f.name,
                f.dataType,
                f.nullable,
                {
                    k: v
                    for k, v in (f.metadata or {}).items()
                    if not k.startswith(_DELTA_FIELD_METADATA_PREFIX)
                },
            )
            for f in schema.fields
        ]
    )


def _file_bounds(schema: StructType, physical: dict[str, str], stats: str | None) -> dict[str, Any]:
    """The column bounds of one Add action's ``stats`` (keyed by ``physical`` name)."""
    if not stats:
        return {}
    document = json.loads(stats)
    low, high = document.get("minValues") or {}, document.get("maxValues") or {}
    return column_bounds(
        schema,
        {c: low.get(physical.get(c, c)) for c in schema.fieldNames()},
        {c: high.get(physical.get(c, c)) for c in schema.fieldNames()},
    )
