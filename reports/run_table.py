"""The report's per-run table: one row per run, from the run ledger and the run's point.

The ledger holds one row per task of a run (``<run>/<task>``). A run's row gathers them:
its data interval, when its first task started and its last one finished, the outcome
(``failed`` if any task failed, ``running`` if any still runs, else ``succeeded``) with the
failed tasks' errors, and the rows and validations of its point. Pure: records in, rows out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from reports.series import LedgerRecord, RunPoint, aware_utc


class TaskRecord(LedgerRecord, Protocol):
    """A ledger row with what the run table shows of a task."""

    @property
    def status(self) -> str: ...

    @property
    def interval_end(self) -> datetime | None: ...

    @property
    def started_at(self) -> datetime: ...

    @property
    def finished_at(self) -> datetime | None: ...

    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True)
class RunRow:
    run_id: str
    interval_start: datetime | None
    interval_end: datetime | None
    started_at: datetime | None
    seconds: float | None  # first task's start to last task's finish; None while running
    tasks: int
    outcome: str  # succeeded, failed or running
    errors: tuple[str, ...]  # "task: error" of each failed task
    rows_in: float
    rows_out: float
    batches_passed: int
    batches_failed: int


def run_rows(ledger: Iterable[TaskRecord], points: Sequence[RunPoint]) -> list[RunRow]:
    """A row for each run in ``points``, in their order."""
    tasks: dict[str, list[TaskRecord]] = defaultdict(list)
    for record in ledger:
        tasks[record.run_id.split("/", 1)[0]].append(record)
    rows = []
    for point in points:
        mine = tasks.get(point.run_id, [])
        failed = [t for t in mine if t.status == "failed"]
        running = any(t.status == "running" for t in mine)
        starts = [aware_utc(t.started_at) for t in mine]
        ends = [aware_utc(t.finished_at) for t in mine if t.finished_at is not None]
        seconds = None
        if starts and ends and not running:
            seconds = (max(ends) - min(starts)).total_seconds()
        intervals = [t for t in mine if t.interval_start is not None]
        rows.append(
            RunRow(
                run_id=point.run_id,
                interval_start=intervals[0].interval_start if intervals else None,
                interval_end=intervals[0].interval_end if intervals else None,
                started_at=min(starts) if starts else None,
                seconds=seconds,
                tasks=len(mine),
                outcome="failed" if failed else "running" if running else "succeeded",
                errors=tuple(
                    f"{t.run_id.partition('/')[2] or t.run_id}: {t.error}" for t in failed
                ),
                rows_in=point.rows_in,
                rows_out=sum(point.stage_out.values()),
                batches_passed=point.batches_passed,
                batches_failed=point.batches_failed,
            )
        )
    return rows
