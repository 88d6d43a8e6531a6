"""The stateful SSBJ / MESHJOIN operator of one equi stage (driven by
``pipeline.ssbj.driver``): one Algorithm 1 loop iteration per step.

A step reads downward through this package:

1. ``planning``: the controller state it starts from (``state``), its place in the
   R-cycle, and its plan, saved before anything is written;
2. ``step_pass``: its reads (``placement``, ``scan_copy``), one pass over the data
   (``joins.ssbj.step``: the new tuples, the state, master partition ``step mod k`` of each
   version the step needs and the master's changes, grouped by a hash of the join value,
   Algorithm 1 per bucket) and at most two commits, the output rows and the state segments
   that changed
   (``commit``); then the hot keys' routing and sketch for the next step (``hot_keys``);
3. ``commit``: the controller state after the step and its pins, completed in one
   state-store transaction.

Operator state lives in two Delta tables under ``_operators/<stage>/`` (``wiring``):

``state``  everything Algorithm 1 keeps between steps, one row per item with a ``_role``
           (see ``joins.ssbj.buckets``): the pending tuples of H_S with their entry step,
           pinned master version and matched flag; the cache H_R at the cache's master
           version (a value without master rows as one empty-entry row); the per-value
           counters f_count and s_count; the values marked for switching and the rows of
           the switching buffer s_B. Partitioned by segment (``joins.ssbj.step``): a step
           replaces the segments that changed, in one commit (none if none did).
``scan``   the operator's copy of the master for the cyclic scan, partitioned by
           ``_scan_part`` = hash(row) mod k, so partition p of every version holds |R|/k
           rows however the master's writer laid out its files (``scan_copy``)

and small controller state (step counter, versions, chunk pins, row counts) in the state
store (``state.ControllerState``).

Exactly once: before anything is written, the step's plan (input range, master version,
state table version, scan copy versions) is saved. All reads use those pinned versions and
the result is a function of them, both writes carry the app transaction of the step, and
the step is completed in one state-store transaction. A rerun after a crash anywhere
recomputes the same result and skips the writes that landed.

Point in time: each tuple is pinned to the master version in force when it entered; the
disk phase reads partition p of that version by time travel until the tuple expires. The
cache is brought to the current version from the master's changes before it serves.
"""

from __future__ import annotations

import logging
import time
from dataclasses import fields, replace
from datetime import timedelta
from typing import Any

from pyspark.sql import DataFrame

from common.errors import ConfigError
from joins.ssbj.algorithm import StepCounts
from pipeline.freshness import due_before
from pipeline.ssbj import commit, planning, step_pass
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import ControllerState
from pipeline.ssbj.wiring import SsbjWiring
from pipeline.stage_config import EquiStage
from warehouse.state_metrics import StepMetricValues

logger = logging.getLogger(__name__)


class SsbjStage:
    """Runs SSBJ (or MESHJOIN, with the cache off) steps for one equi stage."""

    def __init__(self, stage: EquiStage, interval: timedelta, wiring: SsbjWiring) -> None:
        """``interval``: the schedule's, by which the stage's freshness bound counts."""
        self.stage = stage
        self._bound = stage.freshness.bound(interval)
        self._scheduled_steps = stage.scheduled_steps(interval)
        self.wiring = wiring

    # ------------------------------------------------------------------ public API

    def run(
        self, run_id: str, drain: bool = False, steps: int | None = None, close: bool = True
    ) -> list[SsbjStepReport]:
        """A scheduled run's steps: ``steps`` (default: the stage's scheduled steps,
        ``EquiStage.scheduled_steps``), fewer when idle; then, with ``close``, the closing
        steps that answer every tuple the freshness bound makes due by the end of this
        run; with ``drain``, steps without new input until nothing is pending. A
        micro-batch of the continuous mode steps without closing (it is no scheduled run)."""
        # Under a memory budget the backlog enters a step at a time, so every step takes
        # the input that fits; otherwise the run's first step takes all of it.
        budgeted = self.wiring.params.memory_bytes is not None
        reports: list[SsbjStepReport] = []
        if steps is not None and steps < 1:
            raise ConfigError(f"steps: expected a whole number >= 1, found {steps}")
        for index in range(self._scheduled_steps if steps is None else steps):
            take_input = index == 0 or budgeted
            # One read a step: idle and step share it.
            progress = planning.load(self.wiring)
            if planning.idle(self.wiring, take_input, progress.state, progress.offset):
                # Nothing pending and nothing new: a step would only rewrite the same
                # state. The operator pauses where it is (the cycle position, the cache
                # and its version stay; the next step brings the cache forward).
                logger.info(
                    "ssbj %s: nothing pending and no input to take; no step taken",
                    self.stage.name,
                )
                break
            if close:
                progress = self._with_run_start(run_id, progress)
            reports.append(self.step(run_id, take_input, progress))
        if drain:
            progress = planning.load(self.wiring)
            while int(progress.state.pending_rows) > 0:
                reports.append(self.step(run_id, False, progress))
                progress = planning.load(self.wiring)
        elif close:
            reports += self._close(run_id, budgeted)
        return reports

    def _with_run_start(self, run_id: str, progress: planning.Progress) -> planning.Progress:
        """``progress`` remembering the first step of run ``run_id`` (saved with the step),
        keeping the runs the bound looks back over."""
        kept = max(self._bound.intervals - 1, 1)
        return replace(progress, state=progress.state.with_run_start(run_id, kept))

    def _close(self, run_id: str, budgeted: bool) -> list[SsbjStepReport]:
        """Steps until no tuple that the freshness bound makes due by the end of this run
        is still pending (``pipeline.freshness.due_before``): none with the scheduled
        steps the bound derives and all input taken at the first; some when a memory
        budget admitted input later in the run, or fewer steps were asked for. With a
        bound of one interval, input a budget left in the input table is due too."""
        reports: list[SsbjStepReport] = []
        while True:
            progress = planning.load(self.wiring)
            state = progress.state
            threshold = due_before(list(state.run_starts.values()), state.next_step, self._bound)
            due = [entry for entry in state.chunks if int(entry) < threshold]
            backlog = (
                budgeted
                and self._bound.intervals == 1
                and planning.input_waiting(self.wiring, progress.offset)
            )
            if not due and state.plan is None and not backlog:
                return reports
            logger.info(
                "ssbj %s: closing the run: %d tuple(s) due within %s still pending%s; step %d",
                self.stage.name,
                sum(state.chunk_rows.get(entry, 0) for entry in due),
                self._bound.describe(),
                ", input left by the memory budget" if backlog else "",
                state.next_step,
            )
            reports.append(self.step(run_id, backlog, self._with_run_start(run_id, progress)))

    def idle(self, take_input: bool, state: ControllerState | None = None) -> bool:
        """True when a step from ``state`` (the controller state, read when not given)
        would have nothing to do: no tuple waits in H_S, no step is half done and (if the
        step would take input) no input version is new."""
        if state is None:  # the state and the offset, in one read
            progress = planning.load(self.wiring)
            return planning.idle(self.wiring, take_input, progress.state, progress.offset)
        return planning.idle(self.wiring, take_input, state)

    def pending_rows(self) -> int:
        """Tuples in H_S after the last completed step (from the controller state)."""
        state = self.wiring.store.operator_state(self.stage.name)
        return int(state.get("pending_rows", 0)) if state else 0

    def state_frame(self) -> DataFrame | None:
        """The operator state table at its latest version, or None before the first step."""
        if not self.wiring.engine.exists(self.wiring.state_path):
            return None
        return self.wiring.engine.read(self.wiring.state_path)

    def record_backfill(self, start: Any, end: Any, input_version: int) -> None:
        """Suppress later live output for tuples a backfill already joined."""
        state = planning.load_state(self.wiring)
        state = state.with_backfill(start.isoformat(), end.isoformat(), input_version)
        self.wiring.store.save_operator_state(self.stage.name, state.to_dict())

    # ------------------------------------------------------------------ one step

    def step(
        self, run_id: str, take_input: bool, progress: planning.Progress | None = None
    ) -> SsbjStepReport:
        """One Algorithm 1 iteration from ``progress`` (the controller state and the
        offset, read afresh when not given); its metrics are recorded with its completion."""
        w = self.wiring
        started = time.monotonic()
        if progress is None:
            progress = planning.load(w)
        state = progress.state.repartitioned(self.wiring.params.partitions, self.stage.name)
        position = planning.position(w, state)
        planned = planning.plan_step(w, state, take_input, progress.offset)
        state = planned.state
        plan = state.plan
        assert plan is not None  # plan_step leaves the step's plan open
        step = plan.step
        version = plan.master_version
        master = self.wiring.engine.snapshot(w.master_path, version)
        report = SsbjStepReport(
            stage=self.stage.name,
            step=step,
            master_version=version,
            state=position.state.value,
            memory_bytes=self.wiring.params.memory_bytes,
            backlog_rows=int(plan.backlog_rows),
            scan_created_seconds=planned.scan_created_seconds,
        )
        done = step_pass.run_pass(w, state, plan, position, master, report)
        counts = done.counts
        for counted in fields(StepCounts):  # the buckets' counts, summed (MESHJOIN: no H_R)
            setattr(report, counted.name, counts[counted.name])
        report.tuples_in -= report.returned  # returning tuples are not new input
        for name in ("late_entered", "late_answered", "late_expired", "late_rows", "late_waiting"):
            setattr(report, name, counts[name])
        report.late_oldest_us = counts.get("late_oldest_us")
        report.late_min_version = counts.get("late_min_version")
        after = commit.complete(
            w, state, plan, done.outcome(w, state, plan, report), report, master
        )
        report.seconds = time.monotonic() - started
        completing = time.monotonic()
        # The step's metrics (numbered from 1) are recorded with its completion.
        commit.finish(w, after, plan, StepMetricValues(run_id, step + 1, report.as_metrics()))
        logger.debug(
            "ssbj %s step %d took %.2fs: plan and reads %.2f, the pass and both writes %.2f, "
            "then %.2f to complete the step in the state store",
            self.stage.name,
            step,
            report.seconds,
            done.planned - started,
            done.written - done.planned,
            time.monotonic() - completing,
        )
        if report.memory_bytes is not None and report.state_bytes > report.memory_bytes:
            logger.warning(
                "ssbj %s step %d: state %.0f B exceeds memory_bytes %d B (the cache grew, or "
                "more tuples missed it than the last step's miss rate predicted)",
                self.stage.name,
                step,
                report.state_bytes,
                report.memory_bytes,
            )
        logger.info(
            "ssbj %s step %d (%s, partition %d/%d): %d in, %d cache hits, %d to H_S, %d expired, "
            "%d out; H_S %d rows, H_R %d rows; master v%d (cache was v%s) %.1fs",
            self.stage.name,
            step,
            position.state.value,
            position.partition + 1,
            position.partitions,
            report.tuples_in,
            report.cache_hits,
            report.entered_pending,
            report.expired,
            report.output_rows,
            report.pending_rows,
            report.cache_rows,
            version,
            state.cache_version,
            report.seconds,
        )
        return report
