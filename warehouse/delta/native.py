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

This module holds the engine's construction and its tables; the engine's work is in layers,
each a class building on the one below: JVM access (:mod:`~warehouse.delta.native_jvm`),
snapshots (:mod:`~warehouse.delta.native_snapshots`), reads
(:mod:`~warehouse.delta.native_reads`), the commit protocol
(:mod:`~warehouse.delta.native_commits`), appends and merges
(:mod:`~warehouse.delta.native_writes`), replaces (:mod:`~warehouse.delta.native_replace`)
and maintenance (:mod:`~warehouse.delta.native_maintenance`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Unpack

from pyspark.sql import SparkSession

from common.errors import ConfigError, DeltaTableError
from warehouse.delta.engine import EngineSettings, NewTable
from warehouse.delta.native_jvm import JVM_ERRORS, jvm_message
from warehouse.delta.native_maintenance import NativeMaintenance
from warehouse.delta.native_replace import NativeReplaces
from warehouse.delta.native_snapshots import SNAPSHOT_CACHE_SIZE
from warehouse.delta.table_paths import table_root
from warehouse.delta.version_cache import VersionCache


class NativeDeltaEngine(NativeReplaces, NativeMaintenance):
    """Delta tables through the delta-spark JVM library; a file action's payload is its Java
    AddFile."""

    name = "native"
    arrow_in_driver = False

    def __init__(
        self,
        session: SparkSession,
        **settings: Unpack[EngineSettings],
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
        super().__init__(session, **settings)
        self._tables = SparkDeltaTable
        # The snapshot caches (warehouse.delta.native_snapshots), empty.
        self._pinned = OrderedDict()
        self._by_version = VersionCache(SNAPSHOT_CACHE_SIZE)

    # ------------------------------------------------------------------ tables

    def exists(self, path: str) -> bool:
        return bool(self._tables.isDeltaTable(self._spark, table_root(path)))

    def _create(self, root: str, table: NewTable) -> bool:
        builder = self._tables.create(self._spark).location(root).addColumns(table.schema)
        if table.partition_by:
            builder = builder.partitionedBy(*table.partition_by)
        for key, value in table.configuration.items():
            builder = builder.property(key, value)
        try:
            builder.execute()
        except JVM_ERRORS as e:
            if self.exists(root):  # another process created it meanwhile
                return False
            raise DeltaTableError(f"cannot create Delta table {root}: {jvm_message(e)}") from e
        return True

    def _latest_version(self, root: str) -> int:
        return int(self._jsnapshot(root).version())
