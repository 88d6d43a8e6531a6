"""Which driver runs a stage, decided once per stage from its config.

``baseline``: equi stages in ``baseline`` mode; ``ssbj``: equi stages in ``ssbj`` or
``meshjoin`` mode; ``theta``: theta stages. The runner and the audit ask :class:`StageDrivers` for a
stage's driver and use it only through the :class:`~pipeline.stage_driver.StageDriver`
protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import SparkSession

from pipeline.config import EquiStage, PipelineConfig, ThetaStage
from pipeline.ssbj_driver import SsbjDriver
from pipeline.stage_driver import StageDriver
from pipeline.stage_inputs import AnyStage, StageInputs
from pipeline.stateless_driver import EquiBaselineDriver, ThetaDriver
from warehouse.delta import DeltaEngine
from warehouse.state_store import StateStore


def driver_kind(stage: AnyStage) -> str:
    """The registry key of the driver that runs ``stage``."""
    if isinstance(stage, ThetaStage):
        return "theta"
    return "baseline" if stage.operator.mode == "baseline" else "ssbj"


class StageDrivers:
    """The drivers of one config's stages over one warehouse, engine and state store."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
    ) -> None:
        self.config = config
        self.inputs = StageInputs(config, engine)
        self.spark = spark
        self.engine = engine
        self.store = store
        self._factories: dict[str, Callable[[Any], StageDriver]] = {
            "baseline": self._baseline,
            "ssbj": self._ssbj,
            "theta": self._theta,
        }

    def driver(self, stage: AnyStage) -> StageDriver:
        return self._factories[driver_kind(stage)](stage)

    def _baseline(self, stage: EquiStage) -> EquiBaselineDriver:
        return EquiBaselineDriver(stage, self.spark, self.engine, self.store, self.inputs)

    def _ssbj(self, stage: EquiStage) -> SsbjDriver:
        return SsbjDriver(stage, self.config, self.spark, self.engine, self.store, self.inputs)

    def _theta(self, stage: ThetaStage) -> ThetaDriver:
        return ThetaDriver(stage, self.spark, self.engine, self.store, self.inputs)
