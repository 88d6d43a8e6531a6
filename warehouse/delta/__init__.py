"""Delta Lake table access behind one small engine API.

``open_engine`` picks the native delta-spark engine when its jars are on the classpath and
the embedded delta-rs engine otherwise. Both write and read real Delta tables.
"""

from __future__ import annotations

from warehouse.delta.api import (
    CDF_PROPERTY,
    CHANGE_TYPE,
    COMMIT_VERSION,
    AppTransaction,
    CommitOutcome,
    DataFile,
    DeltaEngine,
    PartitionFilter,
    Snapshot,
)
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
