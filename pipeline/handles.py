"""A config and the open handles a pipeline runs with: its Spark session, Delta engine and
state store, and the warehouse layout the config names.

The runner, the auditor, the audit intents and the stage drivers of one command share one
``PipelineHandles``: they read and write the same warehouse through the same engine and
state store, so they are given them together rather than as four arguments each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from pipeline.config import PipelineConfig
from pipeline.layout import WarehouseLayout
from warehouse.delta import DeltaEngine
from warehouse.state_store import StateStore


@dataclass(frozen=True)
class PipelineHandles:
    """What one command of a pipeline works against; ``layout`` follows from ``config``."""

    config: PipelineConfig
    spark: SparkSession
    engine: DeltaEngine
    store: StateStore
    layout: WarehouseLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layout", WarehouseLayout.of(self.config))
