"""Which driver runs a stage, decided from its config and, for ``mode: auto``, its sizes.

``baseline``: equi stages in ``baseline`` mode; ``ssbj``: equi stages in ``ssbj`` or
``meshjoin`` mode; ``theta``: theta stages. An equi stage in ``auto`` mode gets one of the
first two from :func:`joins.ssbj.choice.choose_equi_mode` over the Delta logs' sizes (no
Spark job) and, where the sizes give SSBJ, :func:`joins.ssbj.choice.measured_choice` over
the costs per tuple of the stage's recent steps in each mode (``pipeline.mode_costs``),
decided once per command and logged with its reason. The runner and the audit
ask :class:`StageDrivers` for a stage's driver and use it only through the
:class:`~pipeline.stage_driver.StageDriver` protocol.

Switching keeps every tuple answered once: a stage whose SSBJ state still holds tuples
when ``auto`` picks the plain join drains them first (the drain also joins the new input
with SSBJ), and the plain join takes over at the next step; SSBJ resumes its step count
above the plain join's (``pipeline.ssbj.planning.load_state``), so the output's app
transactions keep increasing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from common.errors import ConfigError
from joins.ssbj.choice import EquiChoice, EquiSizes, choose_equi_mode, measured_choice
from pipeline.baseline_driver import EquiBaselineDriver
from pipeline.handles import PipelineHandles
from pipeline.late_table import late_table
from pipeline.mode_costs import recent_mode_costs
from pipeline.ssbj.driver import SsbjDrainingDriver, SsbjDriver
from pipeline.ssbj.state import held_back
from pipeline.ssbj.warm import WarmCache
from pipeline.stage_config import EquiStage, ThetaStage
from pipeline.stage_driver import StageDriver
from pipeline.stage_inputs import AnyStage, StageInputs
from pipeline.theta_driver import ThetaDriver
from pipeline.waiting_tuples import waiting_records
from warehouse.delta.live_rows import rows_committed

logger = logging.getLogger(__name__)


def driver_kind(stage: AnyStage) -> str:
    """The registry key of the driver that runs ``stage``; ``auto`` is decided per command."""
    if isinstance(stage, ThetaStage):
        return "theta"
    if stage.operator.mode == "auto":
        return "auto"
    return "baseline" if stage.operator.mode == "baseline" else "ssbj"


class StageDrivers:
    """The drivers of one config's stages over one warehouse, engine and state store."""

    def __init__(self, handles: PipelineHandles) -> None:
        self.config, self.spark = handles.config, handles.spark
        self.engine, self.store = handles.engine, handles.store
        self.inputs = StageInputs(handles.config, handles.engine)
        self._factories: dict[str, Callable[[Any], StageDriver]] = {
            "baseline": self._baseline,
            "ssbj": self._ssbj,
            "theta": self._theta,
            "auto": self._auto,
        }
        self._choices: dict[str, EquiChoice] = {}
        # Each SSBJ stage's warm cache, kept across its drivers for this registry's
        # lifetime (``pipeline.ssbj.warm``): a driver is built for every step.
        self._warm: dict[str, WarmCache] = {}

    def driver(self, stage: AnyStage) -> StageDriver:
        kind = driver_kind(stage)
        if kind not in ("ssbj", "auto"):
            self._refuse_held_tuples(stage, kind)
        if kind == "ssbj":
            self._refuse_late_tuples(stage)
        return self._factories[kind](stage)

    def _late_waiting(self, stage: AnyStage) -> int:
        """Tuples of ``stage`` that wait for late master rows (``pipeline.waiting_tuples``)."""
        records = waiting_records(self.engine, late_table(self.inputs.layout, stage.name))
        return 1 if records is None else records

    def _refuse_late_tuples(self, stage: AnyStage) -> None:
        """SSBJ keeps no late tuples: moving a stage to it while some wait would strand them."""
        waiting = self._late_waiting(stage)
        if waiting:
            raise ConfigError(
                f"stages.{stage.name}: the config now runs it with SSBJ, but {waiting} "
                "tuple(s) wait in its late table for master rows; set operator.mode back to "
                "baseline (with or without late_master: without it they expire at the next "
                "step) and run it once, then change it (nothing was read or written)"
            )

    def decide_again(self) -> None:
        """Forget ``auto``'s choices: the next ask weighs each stage again, with the steps
        measured since (a long-lived stream asks once per micro-batch, as a command does)."""
        self._choices.clear()

    def choice(self, stage: EquiStage) -> EquiChoice:
        """``auto``'s join for ``stage``, decided at the first ask of this registry."""
        known = self._choices.get(stage.name)
        if known is not None:
            return known
        waiting = self._late_waiting(stage)
        if stage.operator.late_master is not None or waiting:
            reason = (
                "operator.late_master is set, and the plain join keeps late tuples"
                if stage.operator.late_master is not None
                else f"{waiting} tuple(s) still wait in its late table (they expire next step)"
            )
            choice = EquiChoice("baseline", reason)
            logger.info("stage %s: auto chose %s: %s", stage.name, choice.mode, choice.reason)
            self._choices[stage.name] = choice
            return choice
        master_path = self.inputs.master_path(stage)
        if not self.engine.exists(master_path):
            # Nothing to weigh yet (and nothing to join): not remembered, asked again later.
            return EquiChoice("baseline", f"the master {master_path} does not exist yet")
        master = self.engine.snapshot(master_path)
        counts = [f.num_records for f in master.files]
        batch_rows = 0
        input_path = self.inputs.input_path(stage)
        if self.engine.exists(input_path):
            consumed = self.store.offset(stage.name).input_version
            latest = self.engine.snapshot(input_path).version
            if latest > consumed:
                batch_rows = rows_committed(self.engine, input_path, consumed, latest)
        sizes = EquiSizes(
            master_bytes=master.size_bytes,
            master_rows=None if None in counts else sum(c or 0 for c in counts),
            batch_rows=batch_rows,
        )
        params = stage.operator
        bound = stage.freshness.bound(self.config.schedule.interval_delta)
        sized = choose_equi_mode(
            sizes,
            params.ssbj_above_bytes,
            params.ssbj_master_batches,
            cycle_runs=min(bound.intervals, params.partitions),
        )
        choice = sized
        if sized.mode == "ssbj":
            costs = recent_mode_costs(self.store, stage.name)
            choice = measured_choice(
                sized,
                costs.ssbj,
                costs.plain,
                cycle_steps=params.partitions,
                last=costs.last,
                holds_tuples=held_back(self.store.operator_state(stage.name)) is not None,
            )
        logger.info("stage %s: auto chose %s: %s", stage.name, choice.mode, choice.reason)
        self._choices[stage.name] = choice
        return choice

    def _auto(self, stage: EquiStage) -> StageDriver:
        if self.choice(stage).mode == "ssbj":
            return self._ssbj(stage)
        held = held_back(self.store.operator_state(stage.name))
        if held:
            logger.info(
                "stage %s: its SSBJ state still holds work (%s): this step drains it with "
                "SSBJ; the plain join takes over at the next step",
                stage.name,
                held,
            )
            return self._ssbj(stage, SsbjDrainingDriver)
        return self._baseline(stage)

    def _refuse_held_tuples(self, stage: AnyStage, kind: str) -> None:
        """A stage whose SSBJ state still holds tuples (H_S, or a half-done step) cannot
        move to a driver that keeps none: those tuples would never be emitted."""
        held = held_back(self.store.operator_state(stage.name))
        if held:
            raise ConfigError(
                f"stages.{stage.name}: the config now runs it with the {kind} driver, but its "
                f"SSBJ state is not empty ({held}); set operator.mode back to ssbj or "
                "meshjoin and run `enrich drain` first (late rows: without "
                "operator.late_master, one run), then change it (nothing was read or written)"
            )

    def _baseline(self, stage: EquiStage) -> EquiBaselineDriver:
        return EquiBaselineDriver(stage, self.spark, self.engine, self.store, self.inputs)

    def _ssbj(self, stage: EquiStage, kind: type[SsbjDriver] = SsbjDriver) -> SsbjDriver:
        return kind(
            stage,
            self.config,
            self.spark,
            self.engine,
            self.store,
            self.inputs,
            self._warm.setdefault(stage.name, WarmCache()),
        )

    def _theta(self, stage: ThetaStage) -> ThetaDriver:
        return ThetaDriver(stage, self.spark, self.engine, self.store, self.inputs)
