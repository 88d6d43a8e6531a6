"""The driver of an equi stage in ``ssbj`` or ``meshjoin`` mode: the SSBJ operator
(``pipeline.ssbj.stage``) behind the :class:`~pipeline.stage_driver.StageDriver` protocol.

A scheduled step runs ``operator.steps_per_run`` operator steps (none when nothing is
pending and nothing new arrived); a drain steps until H_S is empty. A backfill re-joins
the interval statelessly and tells the operator, which then suppresses the live output of
tuples the backfill already joined. The pending tuples the audit accounts for are H_S in
the operator's state table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import narwhals.stable.v2 as nw
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from common.rows import Frame, Rows
from joins.ssbj.late import WAITING_SINCE
from joins.ssbj.step import ENTRY_STEP, pending_tuples
from pipeline.baseline_driver import EquiBaselineDriver
from pipeline.config import PipelineConfig
from pipeline.late_table import LATE_SINCE
from pipeline.ssbj.stage import SsbjStage
from pipeline.ssbj.state import ControllerState
from pipeline.ssbj.warm import WarmCache
from pipeline.ssbj.wiring import SsbjWiring
from pipeline.stage_config import EquiStage
from pipeline.stage_driver import StageReport, StepMetrics
from pipeline.stage_inputs import StageInputs
from pipeline.stateless_driver import without_tuples
from pipeline.waiting_tuples import waiting_ages
from quality.audit_views import MAX_AGE_STEPS, pending_ages
from warehouse.delta import DeltaEngine
from warehouse.delta.live_rows import table_rows
from warehouse.state_store import StateStore


class SsbjDriver:
    """Drives one SSBJ / MESHJOIN stage."""

    def __init__(
        self,
        stage: EquiStage,
        config: PipelineConfig,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        inputs: StageInputs,
        warm: WarmCache | None = None,
    ) -> None:
        """``warm``: what this stage's earlier steps in this process left for the next
        (``pipeline.ssbj.warm``); a fresh one when not given."""
        self._stage = stage
        self.engine = engine
        self.store = store
        self.inputs = inputs
        wiring = SsbjWiring.of(
            stage,
            config,
            spark,
            engine,
            store,
            lambda after, to: inputs.new_rows(stage, after, to, keep_version=True),
            output_path=inputs.layout.staged(stage.output),
            input_path=inputs.input_path(stage),
            warm=warm,
        )
        self.operator = SsbjStage(stage, config.schedule.interval_delta, wiring)
        # A backfill is a stateless re-join of the interval.
        self._interval_join = _IntervalJoin(
            stage, spark, engine, store, inputs, self._waiting_tuples
        )

    @property
    def stage(self) -> EquiStage:
        return self._stage

    def step(self, run_id: str, steps: int | None = None, close: bool = True) -> StageReport:
        return self._run(run_id, drain=False, steps=steps, close=close)

    def drain(self, run_id: str) -> StageReport:
        return self._run(run_id, drain=True)

    def backfill(self, start: datetime, end: datetime, run_id: str) -> StageReport:
        report, input_version = self._interval_join.replace_interval(start, end)
        self.operator.record_backfill(start, end, input_version)
        return report

    def _waiting_tuples(self) -> DataFrame | None:
        """The tuples that wait for late master rows in the operator's state (late rows
        and returned ones in H_S), as stream tuples; None without a state table."""
        state = self.operator.state_frame()
        if state is None:
            return None
        return pending_tuples(Rows.of(state)).to_spark().where(F.col(WAITING_SINCE).isNotNull())

    def work_due(self) -> bool:
        return not self.operator.idle(take_input=True)

    def consumed_version(self) -> int:
        return self.store.offset(self._stage.name).input_version

    def pending_table(self) -> str | None:
        return self.operator.wiring.state_path

    def pending_version(self) -> int | None:
        path = self.operator.wiring.state_path
        return self.engine.snapshot(path).version if self.engine.exists(path) else None

    def pending_at(self, version: int) -> Rows:
        path = self.operator.wiring.state_path
        return pending_tuples(table_rows(self.engine, path, version))

    def pending_ages(self, id_column: str) -> Rows | None:
        """Steps waited by the tuples in H_S, and intervals waited by those waiting for a
        late master row (``pipeline.waiting_tuples.waiting_ages``)."""
        path = self.operator.wiring.state_path
        if not self.engine.exists(path):
            return None
        tuples = pending_tuples(table_rows(self.engine, path))
        in_cycle = pending_ages(
            Rows.apply(_where, tuples, waiting=False), id_column, ENTRY_STEP, *self._age_steps()
        )
        late = waiting_ages(
            Rows.apply(_where, tuples, waiting=True),
            id_column,
            *self._late_wait(),
            datetime.now(UTC),
        )
        return Rows.apply(_in_cycle_and_late, in_cycle, late, late_max_age=self._late_max_age())

    def input_accounting(self, tuples: Rows, waiting: Rows | None, id_column: str) -> Rows:
        # The plain join's rule: a tuple must be emitted when its key is in the master.
        return self._interval_join.input_accounting(tuples, waiting, id_column)

    def _late_wait(self) -> tuple[timedelta, timedelta]:
        """The stage's wait for late master rows (zero without ``late_master``) and its
        schedule interval: ages of waiting tuples are counted in intervals."""
        late = self._stage.operator.late_master
        wait = late.wait_delta if late is not None else timedelta(0)
        return wait, self.inputs.config.schedule.interval_delta

    def _late_max_age(self) -> int:
        """The most intervals a tuple waits for a late master row: its wait, the interval a
        step may take to come, and one R-cycle of k steps (a tuple that returned for a
        newer version is settled when its cycle ends)."""
        wait, interval = self._late_wait()
        return math.ceil(wait / interval) + 1 + self._stage.operator.partitions

    def _age_steps(self) -> tuple[int, int]:
        """The step the next pending tuple's age is counted to, and the most steps a tuple
        may wait (one R-cycle of k steps)."""
        stored = self.store.operator_state(self._stage.name)
        next_step = ControllerState.from_dict(stored).next_step if stored else 0
        return next_step, self._stage.operator.partitions

    def _run(
        self, run_id: str, drain: bool, steps: int | None = None, close: bool = True
    ) -> StageReport:
        stage = self._stage
        if not self.engine.exists(self.inputs.input_path(stage)):
            return StageReport(stage.name)
        taken = self.operator.run(run_id, drain=drain, steps=steps, close=close)
        report = StageReport(
            stage.name,
            step=taken[-1].step + 1 if taken else self.store.offset(stage.name).step_seq,
        )
        for step in taken:
            report.tuples_in += step.tuples_in
            report.output_rows += step.output_rows
            report.tuples_pending = step.pending_rows
            report.master_bytes_read += step.master_bytes_read
            report.seconds += step.seconds
            report.steps.append(StepMetrics(step.step + 1, step.as_metrics(), recorded=True))
        return report


class SsbjDrainingDriver(SsbjDriver):
    """An ``auto`` stage leaving SSBJ for the plain join: its scheduled step is a drain, so
    no tuple is left in H_S when the plain join (which keeps none) takes over."""

    def step(self, run_id: str, steps: int | None = None, close: bool = True) -> StageReport:
        return self.drain(run_id)


class _IntervalJoin(EquiBaselineDriver):
    """The stateless re-join of a backfilled interval for an SSBJ stage: without the
    tuples that wait for late master rows in the operator's state, which the live steps
    answer (as the plain join leaves those of its late table to them)."""

    def __init__(
        self,
        stage: EquiStage,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        inputs: StageInputs,
        waiting: Callable[[], DataFrame | None],
    ) -> None:
        super().__init__(stage, spark, engine, store, inputs)
        self._waiting = waiting

    def backfilled(self, rows: DataFrame) -> DataFrame:
        waiting = self._waiting()
        return rows if waiting is None else without_tuples(rows, waiting)


def _where(tuples: Frame, waiting: bool) -> Frame:
    """The pending tuples that wait for a late master row (``waiting``; with their wait's
    start as ``_late_since``), or the others."""
    since = nw.col(WAITING_SINCE)
    if waiting:
        return tuples.filter(~since.is_null()).rename({WAITING_SINCE: LATE_SINCE})
    return tuples.filter(since.is_null())


def _in_cycle_and_late(in_cycle: Frame, late: Frame, late_max_age: int) -> Frame:
    """``audit_pending`` of H_S's tuples and of those waiting for a late master row, whose
    most age is the late wait's (:meth:`SsbjDriver._late_max_age`)."""
    schema = in_cycle.collect_schema()
    late = late.with_columns(nw.lit(late_max_age, nw.Int64()).alias(MAX_AGE_STEPS))
    return nw.concat([in_cycle, late.select(*(nw.col(n).cast(t) for n, t in schema.items()))])
