"""The native Delta engine: delta-spark's ``format("delta")``, its jars on ``spark.jars``.

delta-spark writes data files and commits in one call, deduplicates app transactions itself
(``txnAppId`` / ``txnVersion`` for writes, the ``spark.databricks.delta.write.txnAppId`` /
``txnVersion`` session settings for merge and delete), honours deletion vectors and column
mapping, and supports ``replaceWhere`` on any column. This module maps the engine API onto
it; where delta-spark's Python API has no call (the live files of a version with their
sizes, row counts and partition values; a DataFrame over some of those files; the actions
of one commit), it uses delta-spark's JVM ``DeltaLog`` / ``Snapshot`` directly, of the jar
version the Makefile pins (``DELTA_JARS``), all of it covered by the engine tests.

Commits and concurrency:

- Every write carries a fresh commit id in its commitInfo ``userMetadata`` (a JSON object
  with ``enrichment.commitId`` and ``commit_metadata``); ``committed=True`` and the version
  reported are those of the commit carrying that id, never of a concurrent writer's commit.
  :meth:`NativeDeltaEngine.history` lifts the JSON's keys into each entry, as the embedded
  engine's commitInfo keys are.
- A transaction the table already records is skipped (``committed=False``) before any data
  is written; a concurrent writer that records it first makes delta-spark refuse or skip
  this commit, also ``committed=False``.
- delta-spark's optimistic conflict check (OSS Delta tables are Serializable) refuses a
  ``replaceWhere``, overwrite or delete when a commit made after the write started added or
  removed files it reads; that surfaces as
  :class:`~common.errors.ConcurrentModificationError`, with nothing committed. Appends into
  other partitions do not conflict.
- ``commit_guard`` runs right before each delta-spark write call, and the crash points
  ``delta.before_commit`` / ``delta.after_commit`` surround that call. delta-spark writes
  the data files and commits in that one call, so unlike the embedded engine the guard runs
  before the files are written, not between the two.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from delta.exceptions.base import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from common.errors import (
    CommitError,
    ConcurrentModificationError,
    ConfigError,
    DeltaTableError,
    TableNotFoundError,
)
from common.faults import crash_point
from common.phase_clock import optional_phase
from common.sql_text import quoted_identifier, string_literal
from warehouse.delta.added_files import FileAction
from warehouse.delta.api import (
    COMMIT_VERSION,
    AppTransaction,
    CommitOutcome,
    DataFile,
    PartitionFilter,
    Snapshot,
    describe_filters,
    history_in_range,
)
from warehouse.delta.commit_protocol import COMMIT_ID_KEY, outcome_after_error, tagged_metadata
from warehouse.delta.engine_base import EngineBase, FileActions, RangeEnd
from warehouse.delta.file_stats import column_bounds
from warehouse.delta.log_replay import replay
from warehouse.delta.partition_paths import delta_partition_literal
from warehouse.delta.schema import require_merge_source, require_same_schema
from warehouse.delta.table_paths import commit_file_location, data_file_location, table_root
from warehouse.delta.version_cache import VersionCache

logger = logging.getLogger(__name__)

_USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
_DML_TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
_DML_TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
_RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
_OPTIMIZE_MAX_FILE_CONF = "spark.databricks.delta.optimize.maxFileSize"
_LISTING_PARALLELISM_CONF = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
# Field metadata delta-spark keeps in a table's schema (column mapping ids, physical names):
# not part of the columns' names or types, so left out of Snapshot.schema.
_DELTA_FIELD_METADATA_PREFIX = "delta."
_PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
# Files removed by the commit after the oldest pinned version are a little older than that
# commit; vacuum keeps this much more.
PIN_MARGIN_HOURS = 1.0
_SNAPSHOT_CACHE_SIZE = 64
# Most commits a snapshot is replayed over; beyond them delta-spark's checkpoint is cheaper.
_REPLAYED_COMMITS = 64
_CONFLICTS: tuple[type[Exception], ...] = (
    DeltaConcurrentModificationException,
    ConcurrentWriteException,
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    MetadataChangedException,
    ProtocolChangedException,
)
# What delta-spark and Spark raise through py4j: JVM errors, converted or not.
_JVM_ERRORS: tuple[type[Exception], ...] = (PySparkException, Py4JError)


@dataclass(frozen=True)
class _Pinned:
    """A snapshot this engine built, with the log's raw path of each of its files."""

    snapshot: Snapshot
    raw_paths: Mapping[str, str]
    physical: Mapping[str, str]  # each column's physical name (column mapping)


class NativeDeltaEngine(EngineBase[Any]):
    """Delta tables through the delta-spark JVM library; a file action's payload is its Java
    AddFile."""

    name = "native"
    arrow_in_driver = False

    def __init__(
        self,
        session: SparkSession,
        *,
        commit_guard: Callable[[], None] | None = None,
        commit_metadata: Mapping[str, str] | None = None,
        table_properties: Mapping[str, str] | None = None,
    ) -> None:
        from delta.tables import DeltaTable as SparkDeltaTable

        from warehouse.spark import has_delta_jars

        if not has_delta_jars(session):
            raise ConfigError(
                "the native Delta engine needs io.delta.tables.DeltaTable on the Spark "
                "classpath; found no delta-spark jars (run `make jars`, or use the embedded "
                "engine)"
            )
        # This engine records commit_metadata in each commit's userMetadata JSON.
        super().__init__(
            session,
            commit_guard=commit_guard,
            commit_metadata=commit_metadata,
            table_properties=table_properties,
        )
        self._tables = SparkDeltaTable
        # Snapshots are immutable per (table, table id, version): built once each.
        self._pinned: OrderedDict[tuple[str, str, int], _Pinned] = OrderedDict()
        # The same snapshots of local tables by (root, version), checked against their
        # commit file instead of the log: a pinned version is served without the JVM, and
        # a new version is replayed from an earlier one (warehouse.delta.log_replay).
        self._by_version: VersionCache[_Pinned] = VersionCache(_SNAPSHOT_CACHE_SIZE)

    # ------------------------------------------------------------------ JVM access

    @property
    def _jvm(self) -> Any:
        jvm = self._spark._jvm
        if jvm is None:  # pragma: no cover - a classic session always has one
            raise ConfigError("the native Delta engine needs a classic (py4j) Spark session")
        return jvm

    def _none(self) -> Any:
        return self._jvm.scala.Option.empty()

    def _java_list(self, seq: Any) -> list[Any]:
        return list(self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))

    def _scala_seq(self, items: Any) -> Any:
        """A Scala immutable Seq of a Java list."""
        return self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toList()

    def _log(self, root: str) -> Any:
        return self._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            self._spark._jsparkSession, root
        )

    def _jsnapshot(self, root: str, version: int | None = None) -> Any:
        """delta-spark's Snapshot of the latest version, or of ``version``."""
        log = self._log(root)
        try:
            latest = log.update(False, self._none(), self._none())
        except _JVM_ERRORS as e:
            raise DeltaTableError(f"cannot open Delta table {root}: {_message(e)}") from e
        if latest.version() < 0:
            raise TableNotFoundError(f"no Delta table at {root}")
        if version is None or version == latest.version():
            return latest
        if version < 0 or version > latest.version():
            raise DeltaTableError(
                f"Delta table {root} has versions 0..{latest.version()}; version {version} "
                "was asked for"
            )
        try:
            return log.getSnapshotAt(version, self._none(), self._none(), False)
        except _JVM_ERRORS as e:
            raise DeltaTableError(
                f"cannot load version {version} of Delta table {root}: {_message(e)}"
            ) from e

    def _frame(self, jdf: Any) -> DataFrame:
        return DataFrame(jdf, self._spark)

    # ------------------------------------------------------------------ tables

    def exists(self, path: str) -> bool:
        return bool(self._tables.isDeltaTable(self._spark, table_root(path)))

    def _create(
        self,
        root: str,
        schema: StructType,
        partition_by: Sequence[str],
        configuration: Mapping[str, str],
    ) -> bool:
        builder = self._tables.create(self._spark).location(root).addColumns(schema)
        if partition_by:
            builder = builder.partitionedBy(*partition_by)
        for key, value in configuration.items():
            builder = builder.property(key, value)
        try:
            builder.execute()
        except _JVM_ERRORS as e:
            if self.exists(root):  # another process created it meanwhile
                return False
            raise DeltaTableError(f"cannot create Delta table {root}: {_message(e)}") from e
        return True

    def _latest_version(self, root: str) -> int:
        return int(self._jsnapshot(root).version())

    # ------------------------------------------------------------------ reads

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        root = table_root(path)
        if timestamp is not None:
            version = self._version_at(root, timestamp)
        if version is not None:
            known = self._by_version.get(root, version)
            if known is not None:
                return known.snapshot
        return self._pin(root, self._jsnapshot(root, version)).snapshot

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
        schema = _logical_schema(stored)
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

    def _pin(self, root: str, jsnap: Any) -> _Pinned:
        version = int(jsnap.version())
        key = (root, str(jsnap.metadata().id()), version)
        pinned = self._pinned.get(key)
        if pinned is not None:
            self._pinned.move_to_end(key)
            return pinned
        pinned = self._replayed(root, version) or self._built(root, jsnap)
        self._pinned[key] = pinned
        while len(self._pinned) > _SNAPSHOT_CACHE_SIZE:
            self._pinned.popitem(last=False)
        self._by_version.put(root, version, pinned)
        return pinned

    def _replayed(self, root: str, version: int) -> _Pinned | None:
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
        return _Pinned(
            replace(earlier, version=version, files=tuple(files.values())),
            {f.path: raw for raw, f in files.items()},
            pinned.physical,
        )

    def _built(self, root: str, jsnap: Any) -> _Pinned:
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
        return _Pinned(
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

    def _version_at(self, root: str, timestamp: datetime) -> int:
        """The latest version committed at or before ``timestamp``."""
        moment = timestamp if timestamp.tzinfo else timestamp.replace(tzinfo=UTC)
        moment_ms = moment.timestamp() * 1000
        commits = [(int(h["version"]), int(h["timestamp"])) for h in self.history(root)]
        at_or_before = [v for v, ts in commits if ts <= moment_ms]
        if not at_or_before:
            first = min(commits, key=lambda c: c[0])
            raise DeltaTableError(
                f"Delta table {root} has no version at or before {moment.isoformat()}: its "
                f"first version ({first[0]}) was committed at "
                f"{datetime.fromtimestamp(first[1] / 1000, UTC).isoformat()}"
            )
        return max(at_or_before)

    def read_files(self, snapshot: Snapshot, files: Sequence[DataFile] | None = None) -> DataFrame:
        """Rows of ``files`` of ``snapshot`` (all by default), deletion vectors applied."""
        if files is None:
            return self.read(snapshot.table_path, snapshot.version)
        columns = snapshot.schema.fieldNames()
        if not files:
            return self._spark.createDataFrame([], snapshot.schema)
        root = table_root(snapshot.table_path)
        jsnap = self._jsnapshot(root, snapshot.version)
        raw_paths = self._pin(root, jsnap).raw_paths
        missing = [f.path for f in files if f.path not in raw_paths]
        if missing:
            raise DeltaTableError(
                f"read of {root} at version {snapshot.version}: {len(missing)} file(s) are not "
                f"live in that version, e.g. {missing[0]}"
            )
        wanted = F.col("path").isin([raw_paths[f.path] for f in files])
        adds = jsnap.allFiles().filter(wanted._jc).collectAsList()
        return self._files_frame(root, jsnap, adds).select(*columns)

    def read_arrow(
        self,
        snapshot: Snapshot,
        files: Sequence[DataFile] | None = None,
        columns: Sequence[str] | None = None,
        where: pc.Expression | None = None,
    ) -> pa.Table:
        """Through Spark (one job): delta-spark applies deletion vectors and column mapping;
        ``where`` is applied to the collected rows."""
        frame = self.read_files(snapshot, files)
        table = frame.select(*(columns or frame.columns)).toArrow()
        return table if where is None else table.filter(where)

    def _files_frame(self, root: str, jsnap: Any, adds: Any) -> DataFrame:
        """A DataFrame over exactly the AddFile actions ``adds`` (a Java list), read as of
        ``jsnap``: deletion vectors and column mapping are honoured by delta-spark."""
        jdf = self._log(root).createDataFrame(jsnap, self._scala_seq(adds), False, self._none())
        return self._frame(jdf)

    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame:
        root = table_root(path)
        if timestamp is not None:
            version = self._version_at(root, timestamp)
        else:
            self._jsnapshot(root, version)  # a clear error for a missing table or version
        reader = self._spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(root)

    def history(self, path: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Commits, newest first: delta-spark's history with ``timestamp`` in epoch
        milliseconds (as delta-rs gives it) and the keys of this engine's ``userMetadata``
        JSON (commit id, ``commit_metadata``) lifted into each entry."""
        root = table_root(path)
        self._jsnapshot(root)
        table = self._tables.forPath(self._spark, root)
        frame = table.history(limit) if limit else table.history()
        entries = []
        for row in frame.withColumn("timestamp", F.unix_millis("timestamp")).collect():
            entry = row.asDict(recursive=True)
            for key, value in _user_metadata(entry.get("userMetadata")).items():
                entry.setdefault(key, value)
            entries.append(entry)
        return entries

    def commit_infos(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, Mapping[str, Any]]]:
        return history_in_range(self, path, after_version, to_version)

    def transaction_version(self, path: str, app_id: str) -> int | None:
        return self._recorded(self._jsnapshot(table_root(path)), app_id)

    def _recorded(self, jsnap: Any, app_id: str) -> int | None:
        """The version of ``app_id`` the snapshot records, if any.

        delta-spark's checksum file of a version lists its app transactions; reading them
        from there spares a state reconstruction (a Spark job) per new version.
        """
        known = jsnap.setTransactionsIfKnown()
        if not known.isEmpty():
            versions = [
                int(t.version()) for t in self._java_list(known.get()) if str(t.appId()) == app_id
            ]
            return max(versions) if versions else None
        recorded = jsnap.transactions().get(app_id)
        return None if recorded.isEmpty() else int(recorded.get())

    def _range_end(self, root: str, version: int) -> RangeEnd[Any]:
        """``version`` pinned, and a reader of Java AddFile actions as of it (delta-spark
        applies each action's deletion vector and the column mapping)."""
        jsnap = self._jsnapshot(root, version)
        end = self._pin(root, jsnap).snapshot

        def read(adds: list[Any]) -> DataFrame:
            frame = self._files_frame(root, jsnap, self._jvm.java.util.ArrayList(adds))
            return frame.select(*end.schema.fieldNames())

        return RangeEnd(end, read)

    def _change_feed(
        self, root: str, after_version: int, to_version: int, schema: StructType
    ) -> DataFrame:
        """delta-spark's ``readChangeFeed`` (``_change_type`` and ``_commit_version`` as it
        gives them)."""
        feed = (
            self._spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", after_version + 1)
            .option("endingVersion", to_version)
            .load(root)
        )
        return feed.select(*schema.fieldNames())

    def rows_added_arrow(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
        with_version: bool = False,
    ) -> pa.Table:
        rows = self.rows_added(path, after_version, to_version, skip_versions)
        return (rows if with_version else rows.drop(COMMIT_VERSION)).toArrow()

    def append_rows_added(
        self,
        source: str,
        after_version: int,
        to_version: int,
        target: str,
        txn: AppTransaction | None = None,
        skip_versions: Sequence[int] = (),
        partition_by: Sequence[str] | None = None,
    ) -> CommitOutcome:
        """Reads the rows and appends them: delta-spark writes every file it commits."""
        rows = self.rows_added(source, after_version, to_version, skip_versions)
        return self.append(target, rows.drop(COMMIT_VERSION), txn, partition_by)

    def count_rows_added(
        self,
        path: str,
        after_version: int,
        to_version: int,
        skip_versions: Sequence[int] = (),
    ) -> int | None:
        """None: a file's live rows are its records minus its deletion vector's, which
        only a read of the table tells apart here."""
        return None

    def rows_by_version(
        self, path: str, after_version: int, to_version: int
    ) -> list[tuple[int, int]]:
        root = table_root(path)
        counts = dict.fromkeys(range(after_version + 1, to_version + 1), 0)
        for version, adds, removes in self._file_actions(root, after_version, to_version):
            updated = {r.path for r in removes if r.data_change}
            for add in adds:
                if not add.data_change or add.path in updated or add.payload is None:
                    continue  # a compaction's file, or a deletion-vector update: no new rows
                stats = add.payload.stats()
                counts[version] += int(json.loads(stats).get("numRecords", 0)) if stats else 0
        return sorted(counts.items())

    def _file_actions(self, root: str, after_version: int, to_version: int) -> FileActions[Any]:
        """(version, adds, removes) of each commit in ``(after_version, to_version]``; each
        add carries its Java AddFile (the latest one of a file is read, so rows deleted
        through a deletion vector are not live), and partitions are keyed by the actions'
        partition values (what a compaction's groups are formed by)."""
        if to_version <= after_version:
            return
        commits = self._log(root).getChanges(after_version + 1, to_version, self._none(), False)
        while commits.hasNext():
            commit = commits.next()
            version = int(commit._1())
            adds: list[FileAction[Any]] = []
            removes: list[FileAction[Any]] = []
            for action in self._java_list(commit._2()):
                kind = action.getClass().getSimpleName()
                if kind not in ("AddFile", "RemoveFile"):
                    continue
                body = json.loads(action.json())["add" if kind == "AddFile" else "remove"]
                partition = tuple(sorted((body.get("partitionValues") or {}).items()))
                file = FileAction(
                    str(action.path()),
                    partition,
                    bool(action.dataChange()),
                    action if kind == "AddFile" else None,
                )
                (adds if kind == "AddFile" else removes).append(file)
            yield version, adds, removes

    # ------------------------------------------------------------------ writes

    def _writer(self, data: DataFrame, txn: AppTransaction | None, user_metadata: str) -> Any:
        writer = data.write.format("delta").option("userMetadata", user_metadata)
        if txn is not None:
            writer = writer.option("txnAppId", txn.app_id).option("txnVersion", txn.version)
        return writer

    def _schema(self, root: str) -> StructType:
        """The newest version's schema, from the log's metadata alone (no file listing)."""
        stored = self._jsnapshot(root).schema().json()
        return _logical_schema(StructType.fromJson(json.loads(stored)))

    def _table_frame(self, root: str, data: DataFrame) -> DataFrame:
        """``data`` with the table's columns in the table's order; refused unless it has
        exactly those columns (a write by name must not add, drop or retype one)."""
        schema = self._schema(root)
        require_same_schema(root, schema, data.schema)
        return data.select(*schema.fieldNames())

    def _append(self, path: str, data: DataFrame, txn: AppTransaction | None) -> CommitOutcome:
        root = table_root(path)
        frame = self._table_frame(root, data)
        return self._commit(
            root,
            "append",
            "the table",
            txn,
            lambda meta: self._writer(frame, txn, meta).mode("append").save(root),
        )

    def append_arrow(
        self,
        path: str,
        data: pa.Table,
        txn: AppTransaction | None = None,
        partition_by: Sequence[str] | None = None,
    ) -> CommitOutcome:
        """:meth:`append` of Arrow rows (delta-spark writes them: one Spark job)."""
        return self.append(path, self._spark.createDataFrame(data), txn, partition_by)

    def overwrite_arrow(
        self, path: str, data: pa.Table, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """:meth:`overwrite` of Arrow rows (delta-spark writes them: one Spark job)."""
        return self.overwrite(path, self._spark.createDataFrame(data), txn)

    def replace_arrow(
        self,
        path: str,
        data: pa.Table,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """:meth:`replace` of Arrow rows (delta-spark writes them: one Spark job)."""
        return self.replace(path, self._spark.createDataFrame(data), where, txn)

    def replace(
        self,
        path: str,
        data: DataFrame,
        where: Sequence[PartitionFilter],
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """``replaceWhere`` (any columns); rows outside ``where`` are refused by delta-spark."""
        root = table_root(path)
        frame = self._table_frame(root, data)
        if not where:
            raise DeltaTableError(f"replace on {root} needs a predicate; use overwrite instead")
        predicate = _sql_predicate(where)
        return self._commit(
            root,
            "replace",
            describe_filters(where),
            txn,
            lambda meta: (
                self._writer(frame, txn, meta)
                .mode("overwrite")
                .option("replaceWhere", predicate)
                .save(root)
            ),
        )

    def delete_partitions(
        self, path: str, where: Sequence[PartitionFilter], txn: AppTransaction | None = None
    ) -> CommitOutcome:
        """A delta-spark DELETE; on partition columns only it removes whole files."""
        root = table_root(path)
        if not where:
            raise DeltaTableError(f"delete_partitions on {root} needs a predicate")
        predicate = _sql_predicate(where)
        table = self._tables.forPath(self._spark, root)

        def delete(meta: str) -> None:
            with self._dml_settings(meta, txn):
                table.delete(predicate)

        return self._commit(root, "delete_partitions", describe_filters(where), txn, delete)

    def overwrite(
        self, path: str, data: DataFrame, txn: AppTransaction | None = None
    ) -> CommitOutcome:
        root = table_root(path)
        frame = self._table_frame(root, data)
        return self._commit(
            root,
            "overwrite",
            "the whole table",
            txn,
            lambda meta: self._writer(frame, txn, meta).mode("overwrite").save(root),
        )

    def merge(
        self,
        path: str,
        source: DataFrame,
        keys: Sequence[str],
        delete_flag: str | None = None,
        txn: AppTransaction | None = None,
    ) -> CommitOutcome:
        """Upsert ``source`` by ``keys``; rows whose ``delete_flag`` is true delete the match."""
        root = table_root(path)
        schema = self._schema(root)
        require_merge_source(root, schema, source, keys, delete_flag)
        values: dict[str, str | Column] = {c: f"s.`{c}`" for c in schema.fieldNames()}
        builder = (
            self._tables.forPath(self._spark, root)
            .alias("t")
            .merge(source.alias("s"), " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys))
        )
        if delete_flag:
            keep = f"NOT s.`{delete_flag}`"
            builder = builder.whenMatchedDelete(f"s.`{delete_flag}`")
            builder = builder.whenMatchedUpdate(keep, values).whenNotMatchedInsert(keep, values)
        else:
            builder = builder.whenMatchedUpdate(set=values).whenNotMatchedInsert(values=values)

        def execute(meta: str) -> None:
            with self._dml_settings(meta, txn):
                builder.execute()

        return self._commit(root, "merge", f"keys {list(keys)}", txn, execute)

    @contextmanager
    def _dml_settings(self, user_metadata: str, txn: AppTransaction | None) -> Iterator[None]:
        """Merge and delete take no writer options: their commitInfo.userMetadata and app
        transaction come from session settings, set only around the call."""
        settings = {_USER_METADATA_CONF: user_metadata}
        if txn is not None:
            settings[_DML_TXN_APP_ID_CONF] = txn.app_id
            settings[_DML_TXN_VERSION_CONF] = str(txn.version)
        with self._session_settings(settings):
            yield

    @contextmanager
    def _session_settings(self, settings: Mapping[str, str]) -> Iterator[None]:
        previous: dict[str, str | None] = {k: self._spark.conf.get(k, None) for k in settings}
        for key, value in settings.items():
            self._spark.conf.set(key, value)
        try:
            yield
        finally:
            for key, old in previous.items():
                if old is None:
                    self._spark.conf.unset(key)
                else:
                    self._spark.conf.set(key, old)

    # ------------------------------------------------------------------ commit protocol

    def _commit(
        self,
        root: str,
        operation: str,
        scope: str,
        txn: AppTransaction | None,
        save: Callable[[str], None],
    ) -> CommitOutcome:
        """Run ``save`` (one delta-spark call that writes and commits) as our tagged commit.

        ``save`` gets the commit's ``userMetadata``: a JSON object holding a fresh commit id
        and ``commit_metadata``. The outcome reports the commit carrying that id, never
        merely "the table moved on".
        """
        # No look-up of the app transaction here: delta-spark checks txnAppId/txnVersion
        # itself, inside the same transaction as the write, and skips a recorded one before
        # writing any data. Checking first as well cost a second read of the version's
        # checksum (about 2 s a commit on local[2]) and could not close the race anyway.
        before = self._latest_version(root)
        commit_id = self._new_commit_id()
        user_metadata = json.dumps(tagged_metadata(self.commit_metadata, commit_id), sort_keys=True)
        self._check_commit_guard()
        crash_point("delta.before_commit")
        try:
            with optional_phase(self.clock, "write"):  # delta-spark writes and commits in one
                save(user_metadata)
        except _JVM_ERRORS as e:
            return self._recover_or_raise(root, before, commit_id, txn, operation, scope, e)
        crash_point("delta.after_commit")
        landed = self._find_commit(root, before, commit_id)
        if landed is None:
            # delta-spark skipped the write: the app transaction was already recorded, by an
            # earlier attempt of this run or by another writer.
            latest = self._latest_version(root)
            logger.info(
                "skip %s on %s: the app transaction %s is already recorded (table at version %d)",
                operation,
                root,
                txn,
                latest,
            )
            return CommitOutcome(table_version=latest, committed=False)
        logger.info(
            "%s on %s committed version %d (commit %s)", operation, root, landed[0], commit_id
        )
        return _outcome(landed[0], landed[1])

    def _find_commit(
        self, root: str, after_version: int, commit_id: str
    ) -> tuple[int, Mapping[str, Any]] | None:
        """(version, commit metrics) of the commit after ``after_version`` carrying the id.

        Reads the commitInfo actions of the newer commits straight from the log (history()
        would build a DataFrame per call).
        """
        latest = self._latest_version(root)
        if latest <= after_version:
            return None
        commits = self._log(root).getChanges(after_version + 1, latest, self._none(), False)
        while commits.hasNext():
            commit = commits.next()
            for action in self._java_list(commit._2()):
                if action.getClass().getSimpleName() != "CommitInfo":
                    continue
                tagged = action.userMetadata()
                if tagged.isEmpty() or _user_metadata(tagged.get()).get(COMMIT_ID_KEY) != commit_id:
                    continue
                metrics = action.operationMetrics()
                entry = {
                    "operationMetrics": {}
                    if metrics.isEmpty()
                    else {
                        str(k): str(v)
                        for k, v in self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
                            metrics.get()
                        ).items()
                    }
                }
                return int(commit._1()), entry
        return None

    def _recover_or_raise(
        self,
        root: str,
        before: int,
        commit_id: str,
        txn: AppTransaction | None,
        operation: str,
        scope: str,
        error: Exception,
    ) -> CommitOutcome:
        """An error from delta-spark: our commit landed anyway, another writer's commit of
        the same app transaction won, a conflict (nothing committed), or a failure."""
        landed = self._find_commit(root, before, commit_id)
        latest = self._jsnapshot(root)
        recovered = outcome_after_error(
            root,
            operation,
            commit_id,
            error,
            txn,
            ours=None if landed is None else _outcome(*landed),
            latest_version=int(latest.version()),
            recorded=lambda app_id: self._recorded(latest, app_id),
        )
        if recovered is not None:
            return recovered
        if isinstance(error, ConcurrentTransactionException):
            raise CommitError(
                f"{operation} on {root} did not land: a concurrent writer committed app "
                f"transaction {txn}, but the table does not record it: {_message(error)}"
            ) from error
        if isinstance(error, _CONFLICTS):
            raise ConcurrentModificationError(
                f"{operation} of {scope} in {root} conflicts with a commit made after version "
                f"{before} (the table is now at version {int(latest.version())}): "
                f"{_message(error)}. Nothing was committed; rerun the operation against the "
                "new version."
            ) from error
        text = _message(error)
        if "REPLACE_WHERE_MISMATCH" in text:
            raise DeltaTableError(
                f"{operation} on {root}: the data has rows outside the replace predicate "
                f"{scope}; nothing was committed ({text})"
            ) from error
        raise CommitError(
            f"{operation} on {root} failed and did not land (table still at version "
            f"{int(latest.version())}): {text}. Rerunning is safe."
        ) from error

    # ------------------------------------------------------------------ maintenance

    def _bin_pack(self, root: str, target_file_bytes: int) -> tuple[int, Mapping[str, Any]]:
        """delta-spark's ``OPTIMIZE``, with this engine's commit metadata as the commit's
        userMetadata."""
        before = self._latest_version(root)
        self._check_commit_guard()
        settings = {
            _OPTIMIZE_MAX_FILE_CONF: str(target_file_bytes),
            _USER_METADATA_CONF: json.dumps(
                tagged_metadata(self.commit_metadata, self._new_commit_id()), sort_keys=True
            ),
        }
        table = "delta." + quoted_identifier(root)
        with self._session_settings(settings):
            row = self._spark.sql(f"OPTIMIZE {table}").collect()[0]
        return before, row["metrics"]

    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]:
        """Delete files no version within the retention needs, and untracked files older
        than it (delta-spark's FULL vacuum); return the files deleted.

        delta-spark has no list of versions to keep, so the retention is stretched to cover
        every commit after the oldest kept version: the files those commits removed stay,
        and every kept version stays readable. delta-spark records the vacuum as two
        commits (``VACUUM START`` / ``VACUUM END``).
        """
        root = table_root(path)
        latest = self._latest_version(root)
        hours = float(retention_hours)
        kept = [v for v in keep_versions if v < latest]
        if kept:
            oldest = min(kept)
            successor = [h for h in self.history(root) if int(h["version"]) == oldest + 1]
            if successor:
                age_ms = datetime.now(UTC).timestamp() * 1000 - int(successor[0]["timestamp"])
                needed = age_ms / 3_600_000 + PIN_MARGIN_HOURS
                if needed > hours:
                    logger.info(
                        "vacuum %s: retention stretched from %gh to %.3fh to keep version %d",
                        root,
                        hours,
                        needed,
                        oldest,
                    )
                    hours = needed
        table = "delta." + quoted_identifier(root)
        before = self._table_files(root)
        settings = {
            _RETENTION_CHECK_CONF: "false",
            # delta-spark lists the table with this many tasks (Spark's default: 10000).
            _LISTING_PARALLELISM_CONF: str(max(1, self._spark.sparkContext.defaultParallelism)),
        }
        with self._session_settings(settings):
            self._spark.sql(f"VACUUM {table} RETAIN {hours:.6f} HOURS").collect()
        deleted = sorted(before - self._table_files(root))
        logger.info("vacuumed %s: %d file(s) deleted", root, len(deleted))
        return deleted

    def _table_files(self, root: str) -> set[str]:
        """Every file under the table's root except its log (data, change data, untracked)."""
        hadoop = self._jvm.org.apache.hadoop.fs.Path(root)
        filesystem = hadoop.getFileSystem(self._spark._jsc.hadoopConfiguration())
        base = str(filesystem.makeQualified(hadoop).toUri().getPath()).rstrip("/")
        found = set()
        listing = filesystem.listFiles(hadoop, True)
        while listing.hasNext():
            location = str(listing.next().getPath().toUri().getPath())
            relative = location[len(base) :].lstrip("/")
            if not relative.startswith("_delta_log/"):
                found.add(location)
        return found


# ---------------------------------------------------------------------- helpers


def _outcome(version: int, entry: Mapping[str, Any]) -> CommitOutcome:
    """The outcome of our commit, with its data volume from delta-spark's metrics."""
    metrics = {k: int(v) for k, v in (entry.get("operationMetrics") or {}).items() if _int(v)}

    def first(*names: str) -> int:
        return next((metrics[n] for n in names if n in metrics), 0)

    rows = first("numOutputRows") or sum(
        metrics.get(n, 0)
        for n in ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsCopied")
    )
    return CommitOutcome(
        table_version=version,
        committed=True,
        files_added=first("numFiles", "numTargetFilesAdded", "numAddedFiles"),
        bytes_added=first("numOutputBytes", "numTargetBytesAdded", "numAddedBytes"),
        rows_added=rows or first("numCopiedRows"),
    )


def _int(value: Any) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True


def _user_metadata(raw: Any) -> dict[str, Any]:
    """The JSON object this engine put into a commit's ``userMetadata``, or nothing."""
    if not raw:
        return {}
    try:
        tagged = json.loads(raw)
    except ValueError:
        return {}  # another writer's free-text userMetadata
    return tagged if isinstance(tagged, dict) else {}


def _message(error: BaseException) -> str:
    """The first line of a JVM error (its stack trace stays on the exception chain)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _logical_schema(schema: StructType) -> StructType:
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


def _sql_predicate(where: Sequence[PartitionFilter]) -> str:
    return " AND ".join(_sql_term(f) for f in where)


def _sql_term(f: PartitionFilter) -> str:
    column = quoted_identifier(f.column)
    if f.op in ("in", "not in"):
        values = ", ".join(_sql_literal(v) for v in f.value)
        return f"{column} {f.op.upper()} ({values})"
    if f.value is None and f.op in ("=", "!="):
        return f"{column} IS {'' if f.op == '=' else 'NOT '}NULL"
    return f"{column} {f.op} {_sql_literal(f.value)}"


def _sql_literal(value: Any) -> str:
    """A Spark SQL literal of ``value``, typed for dates and timestamps (UTC)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = delta_partition_literal(value)
    assert text is not None
    quoted = string_literal(text)
    if isinstance(value, datetime):
        return f"TIMESTAMP {quoted}"
    if isinstance(value, date):
        return f"DATE {quoted}"
    return quoted


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
