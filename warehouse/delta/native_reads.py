"""The native engine's reads: snapshots by version or time, rows, history and changes.

Whole versions are read with ``format("delta")``; some files of a version, the Add actions
of a range of commits and the rows they added through delta-spark's ``DeltaLog`` (deletion
vectors and column mapping applied by delta-spark). ``history`` lifts the keys of this
engine's ``userMetadata`` JSON into each entry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from common.errors import DeltaTableError
from warehouse.delta.added_files import FileAction
from warehouse.delta.api import DataFile, Snapshot
from warehouse.delta.engine import FileActions, RangeEnd
from warehouse.delta.native_snapshots import NativeSnapshots
from warehouse.delta.table_paths import table_root


class NativeReads(NativeSnapshots):
    """Reads of tables, their history, app transactions and the changes between versions."""

    def snapshot(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> Snapshot:
        root = table_root(path)
        version = self._version_as_of(root, version, timestamp)
        if version is not None:
            known = self._by_version.get(root, version)
            if known is not None:
                return known.snapshot
        return self._pin(root, self._jsnapshot(root, version)).snapshot

    def _version_as_of(
        self, root: str, version: int | None, timestamp: datetime | None
    ) -> int | None:
        """``version``, or with a ``timestamp`` the latest version committed at or before it."""
        if timestamp is None:
            return version
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

    def _files_frame(self, root: str, jsnap: Any, adds: Any) -> DataFrame:
        """A DataFrame over exactly the AddFile actions ``adds`` (a Java list), read as of
        ``jsnap``: deletion vectors and column mapping are honoured by delta-spark."""
        jdf = self._log(root).createDataFrame(jsnap, self._scala_seq(adds), False, self._none())
        return self._frame(jdf)

    def read(
        self, path: str, version: int | None = None, timestamp: datetime | None = None
    ) -> DataFrame:
        root = table_root(path)
        if timestamp is None:
            self._jsnapshot(root, version)  # a clear error for a missing table or version
        version = self._version_as_of(root, version, timestamp)
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
            for key, value in tagged_user_metadata(entry.get("userMetadata")).items():
                entry.setdefault(key, value)
            entries.append(entry)
        return entries

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

    def _live_records(self, payload: Any) -> int | None:
        """The Java AddFile's ``numRecords`` less the rows its deletion vector removes (its
        cardinality), as :meth:`_built` counts a snapshot's files."""
        return logical_records(json.loads(payload.json())["add"])

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


def logical_records(add: dict[str, Any]) -> int | None:
    """The live rows of a file from its ``add`` action: the statistics' ``numRecords``
    less its deletion vector's cardinality; None without statistics."""
    stats = json.loads(add["stats"]) if add.get("stats") else {}
    if "numRecords" not in stats:
        return None
    deleted = (add.get("deletionVector") or {}).get("cardinality", 0)
    return int(stats["numRecords"]) - int(deleted)


def tagged_user_metadata(raw: Any) -> dict[str, Any]:
    """The JSON object this engine put into a commit's ``userMetadata``, or nothing."""
    if not raw:
        return {}
    try:
        tagged = json.loads(raw)
    except ValueError:
        return {}  # another writer's free-text userMetadata
    return tagged if isinstance(tagged, dict) else {}
