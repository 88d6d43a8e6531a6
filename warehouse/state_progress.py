"""Stage offsets and operator state: how far each stage has consumed its input.

A step is planned (its input range and master version fixed before any write, so a rerun
repeats it) and completed with its offset, the operator's controller state, its pins and
its metrics in one transaction, so a step is never half recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from warehouse.state_metrics import StepMetricValues, metric_rows
from warehouse.state_pins import replace_pins, wanted_pins
from warehouse.state_sessions import StoreSessions
from warehouse.state_statements import STEP
from warehouse.state_tables import OperatorState, StageOffset, utcnow


class StageProgress(StoreSessions):
    """The store's ``stage_offsets`` and ``operator_state`` tables."""

    def offset(self, stage: str) -> StageOffset:
        with self._session() as session:
            return _offset_in(session, stage)

    def set_offset(self, stage: str, input_version: int, step_seq: int) -> None:
        """Record a completed step: the input is consumed up to ``input_version``."""
        with self._session() as session:
            row = session.get(StageOffset, stage)
            if row is None:
                row = StageOffset(stage=stage)
                session.add(row)
            row.input_version, row.step_seq, row.updated_at = input_version, step_seq, utcnow()
            row.planned_input_version = row.planned_master_version = None

    def plan_step(self, stage: str, input_version: int, master_version: int | None) -> StageOffset:
        """Fix the next step's input range and master version, unless one is already planned."""
        with self._session() as session:
            row = session.get(StageOffset, stage)
            if row is None:
                row = StageOffset(stage=stage, input_version=0, step_seq=0)
                session.add(row)
            if row.planned_input_version is None:
                row.planned_input_version = input_version
                row.planned_master_version = master_version
                row.updated_at = utcnow()
            session.flush()
            return row

    def complete_step(
        self,
        stage: str,
        input_version: int,
        step_seq: int,
        state: Mapping[str, Any],
        pins: tuple[str, Mapping[str, Sequence[int]]] | None = None,
        metrics: StepMetricValues | None = None,
    ) -> None:
        """Record a finished operator step and its controller state in one transaction;
        with ``pins`` (holder, table path -> versions), make those the holder's pins in
        the same transaction (:meth:`set_pins`); with ``metrics``, record the step's
        metrics in it too (:meth:`record_metrics`): a step is never completed without
        them, nor they recorded for a step that was not."""
        pinned = None if pins is None else (pins[0], wanted_pins(*pins))
        now = utcnow()
        with self._session() as session:
            if metrics is not None and metrics.values:
                session.execute(
                    STEP.insert_metrics,
                    metric_rows(metrics.run_id, stage, metrics.step, metrics.values, now),
                )
            found = session.execute(
                STEP.complete_offset,
                {
                    "b_stage": stage,
                    "b_input_version": input_version,
                    "b_step_seq": step_seq,
                    "b_at": now,
                },
            )
            if not _matched(found):
                session.execute(
                    STEP.insert_offset,
                    {
                        "stage": stage,
                        "input_version": input_version,
                        "step_seq": step_seq,
                        "updated_at": now,
                    },
                )
            put_operator_state(session, stage, state)
            if pinned is not None:
                replace_pins(session, *pinned)

    def operator_state(self, stage: str) -> dict[str, Any] | None:
        with self._session() as session:
            return _operator_state_in(session, stage)

    def stage_progress(self, stage: str) -> tuple[StageOffset, dict[str, Any] | None]:
        """:meth:`offset` and :meth:`operator_state` of ``stage`` in one transaction, as a
        step starts from them."""
        with self._session() as session:
            return _offset_in(session, stage), _operator_state_in(session, stage)

    def save_operator_state(
        self,
        stage: str,
        state: Mapping[str, Any],
        pins: tuple[str, Mapping[str, Sequence[int]]] | None = None,
    ) -> None:
        """Save ``stage``'s controller state; with ``pins`` (holder, table path ->
        versions), first make those the holder's pins, in the same transaction (a plan is
        saved with the pins that keep what it reads)."""
        pinned = None if pins is None else (pins[0], wanted_pins(*pins))
        with self._session() as session:
            if pinned is not None:
                replace_pins(session, *pinned)
            put_operator_state(session, stage, state)


def _offset_in(session: Session, stage: str) -> StageOffset:
    """Within ``session``: ``stage``'s offset, or a new stage's (nothing consumed)."""
    row = session.get(StageOffset, stage)
    if row is None:
        return StageOffset(stage=stage, input_version=0, step_seq=0)
    return row


def _operator_state_in(session: Session, stage: str) -> dict[str, Any] | None:
    """Within ``session``: a copy of ``stage``'s controller state, or None."""
    row = session.get(OperatorState, stage)
    return None if row is None else json.loads(json.dumps(row.state))


def put_operator_state(session: Session, stage: str, state: Mapping[str, Any]) -> None:
    """Within ``session``: ``stage``'s controller state becomes ``state``."""
    payload = json.loads(json.dumps(state))
    now = utcnow()
    found = session.execute(STEP.update_state, {"b_stage": stage, "b_state": payload, "b_at": now})
    if not _matched(found):
        session.execute(STEP.insert_state, {"stage": stage, "state": payload, "updated_at": now})


def _matched(result: Any) -> bool:
    """Whether an UPDATE found its row (``rowcount``: the rows it matched)."""
    return bool(result.rowcount)
