"""Per-run metrics: the measured values of each step of each stage in each run.

A step's metrics are recorded with its completion (``StageProgress.complete_step``) or on
their own; ``enrich plan`` and the run report read them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from warehouse.state_sessions import StoreSessions
from warehouse.state_statements import STEP
from warehouse.state_tables import Metric, utcnow


@dataclass(frozen=True)
class StepMetricValues:
    """A step's metrics, recorded with its completion (``StateStore.complete_step``)."""

    run_id: str
    step: int
    values: Mapping[str, float]


def metric_rows(
    run_id: str, stage: str, step: int, values: Mapping[str, float], now: datetime
) -> list[dict[str, Any]]:
    """The rows of one multi-row insert: a step records a few dozen values, and the ORM's
    unit of work costs more than the rows."""
    return [
        {
            "run_id": run_id,
            "stage": stage,
            "step": step,
            "name": name,
            "value": float(value),
            "recorded_at": now,
        }
        for name, value in values.items()
    ]


class Metrics(StoreSessions):
    """The store's ``run_metrics`` table."""

    def record_metrics(
        self, run_id: str, stage: str, step: int, values: Mapping[str, float]
    ) -> None:
        if not values:
            return
        with self._session() as session:
            session.execute(STEP.insert_metrics, metric_rows(run_id, stage, step, values, utcnow()))

    def metrics(self, run_id: str | None = None) -> list[Metric]:
        with self._session() as session:
            query = select(Metric).order_by(Metric.id)
            if run_id is not None:
                query = query.where(Metric.run_id == run_id)
            return list(session.scalars(query))

    def recent_step_metrics(
        self, stage: str, names: Sequence[str], limit: int
    ) -> list[StepMetricValues]:
        """The values named ``names`` of ``stage``'s latest steps, at most ``limit`` metric
        rows read, newest step first (a step recorded twice, as a rerun does: its latest)."""
        query = (
            select(Metric.run_id, Metric.step, Metric.name, Metric.value)
            .where(Metric.stage == stage, Metric.name.in_(list(names)))
            .order_by(Metric.id.desc())
            .limit(limit)
        )
        steps: dict[tuple[str, int], dict[str, float]] = {}
        with self._session() as session:
            for run_id, step, name, value in session.execute(query):
                steps.setdefault((run_id, step), {}).setdefault(name, value)
        return [StepMetricValues(r, s, values) for (r, s), values in steps.items()]
