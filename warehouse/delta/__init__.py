"""Delta Lake table access behind one small engine API.

``open_engine`` returns the embedded engine (delta-rs for the log, Spark's Parquet writer
for data) for ``auto`` and ``embedded``, and the native delta-spark engine for ``native``
(its jars must be on the classpath; refused over Spark Connect). Both write and read real
Delta tables (:mod:`warehouse.delta.factory`).
"""

from __future__ import annotations

from warehouse.delta.api import (
    CDF_PROPERTY,
    CHANGE_TYPE,
    COMMIT_VERSION,
    AppTransaction,
    CommitOutcome,
    DataFile,
    PartitionFilter,
    Snapshot,
)
from warehouse.delta.engine import DeltaEngine
from warehouse.delta.factory import open_engine

__all__ = [
    "CDF_PROPERTY",
    "CHANGE_TYPE",
    "COMMIT_VERSION",
    "AppTransaction",
    "CommitOutcome",
    "DataFile",
    "DeltaEngine",
    "PartitionFilter",
    "Snapshot",
    "open_engine",
]
