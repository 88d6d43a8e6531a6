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

from common.errors import ConfigError
from pipeline.config import EquiStage, PipelineConfig, ThetaStage
from pipeline.ssbj_driver import SsbjDriver
from pipeline.ssbj_stage import held_back
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
        kind = driver_kind(stage)
        if kind != "ssbj":
            self._refuse_held_tuples(stage, kind)
        return self._factories[kind](stage)

    def _refuse_held_tuples(self, stage: AnyStage, kind: str) -> None:
        """A stage whose SSBJ state still holds tuples (H_S, or a half-done step) cannot
        move to a driver that keeps none: those tuples would never be emitted."""
        held = held_back(self.store.operator_state(stage.name))
        if held:
            raise ConfigError(
                f"stages.{stage.name}: the config now runs it with the {kind} driver, but its "
                f"SSBJ state is not empty ({held}); set operator.mode back to ssbj or "
                "meshjoin and run `enrich drain` first, then change it (nothing was read or "
                "written)"
            )

    def _baseline(self, stage: EquiStage) -> EquiBaselineDriver:
        return EquiBaselineDriver(stage, self.spark, self.engine, self.store, self.inputs)

    def _ssbj(self, stage: EquiStage) -> SsbjDriver:
        return SsbjDriver(stage, self.config, self.spark, self.engine, self.store, self.inputs)

    def _theta(self, stage: ThetaStage) -> ThetaDriver:
        return ThetaDriver(stage, self.spark, self.engine, self.store, self.inputs)
