"""The run ledger: each invocation of pipeline work, its attempts and its outcome.

A scheduled interval, a backfill or a drain is recorded as running when it starts and as
succeeded or failed when it ends; a rerun of the same run id counts as another attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from common.errors import StateStoreError
from warehouse.state_sessions import StoreSessions
from warehouse.state_tables import Run, utcnow


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    kind: str
    status: str
    interval_start: datetime | None
    interval_end: datetime | None
    started_at: datetime
    finished_at: datetime | None
    error: str | None


class RunLedger(StoreSessions):
    """The store's ``runs`` table."""

    def start_run(
        self,
        run_id: str,
        kind: str,
        interval_start: datetime | None = None,
        interval_end: datetime | None = None,
    ) -> None:
        """Record a run as running; a rerun of the same id counts as another attempt."""
        with self._session() as session:
            run = session.get(Run, run_id)
            if run is None:
                session.add(
                    Run(
                        run_id=run_id,
                        kind=kind,
                        interval_start=interval_start,
                        interval_end=interval_end,
                    )
                )
            else:
                run.attempts += 1
                run.status = "running"
                run.error = None
                run.finished_at = None

    def finish_run(self, run_id: str, error: str | None = None) -> None:
        with self._session() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise StateStoreError(f"finish_run: no run {run_id!r} was started")
            run.status = "failed" if error else "succeeded"
            run.error = error
            run.finished_at = utcnow()

    def runs(self, limit: int = 20, since: datetime | None = None) -> list[RunSummary]:
        with self._session() as session:
            query = select(Run).order_by(Run.started_at.desc()).limit(limit)
            if since is not None:
                query = query.where(Run.started_at >= since)
            return [
                RunSummary(
                    r.run_id,
                    r.kind,
                    r.status,
                    r.interval_start,
                    r.interval_end,
                    r.started_at,
                    r.finished_at,
                    r.error,
                )
                for r in session.scalars(query)
            ]
