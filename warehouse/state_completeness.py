"""Interval completeness: each output's event-time intervals, and whether they are done.

One row per output table and interval: its root-stream tuples, how many still wait or sit
in a quarantined batch, and since when and by which run it is complete
(``pipeline.completeness`` computes them and saves them with its progress and pins).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select

from warehouse.state_pins import replace_pins, wanted_pins
from warehouse.state_progress import put_operator_state
from warehouse.state_sessions import StoreSessions
from warehouse.state_tables import IntervalCompleteness


@dataclass(frozen=True)
class IntervalRecord:
    """A row of ``interval_completeness``, as the store reads and writes it.

    ``quarantined``: tuples answered into an output batch that was quarantined and is not
    resolved yet (not published). ``completed_at``/``completed_run_id``: when, and by
    which run, the interval last became complete (None while it is not); ``run_id``: the
    run that recorded these values.
    """

    table: str
    interval_start: datetime
    interval_end: datetime
    tuples: int
    waiting: int
    quarantined: int
    oldest_waiting_entered_at: datetime | None
    complete: bool
    completed_at: datetime | None
    completed_run_id: str | None
    run_id: str


class Completeness(StoreSessions):
    """The store's ``interval_completeness`` table."""

    def save_completeness(
        self,
        records: Sequence[IntervalRecord],
        state: tuple[str, Mapping[str, Any]],
        pins: tuple[str, Mapping[str, Sequence[int]]],
    ) -> None:
        """Write ``records`` (one row per table and interval, replacing any there), the
        computation's progress ``state`` (key, controller state) and its ``pins`` (holder,
        table path -> versions), in one transaction."""
        pinned = (pins[0], wanted_pins(*pins))
        with self._session() as session:
            for record in records:
                row = session.get(IntervalCompleteness, (record.table, record.interval_start))
                if row is None:
                    row = IntervalCompleteness(
                        table_name=record.table, interval_start=record.interval_start
                    )
                    session.add(row)
                for name in _RECORD_FIELDS:
                    setattr(row, name, getattr(record, name))
            put_operator_state(session, *state)
            replace_pins(session, *pinned)

    def interval_records(
        self,
        table: str,
        *,
        latest: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        incomplete: bool = False,
        starts: Sequence[datetime] = (),
    ) -> list[IntervalRecord]:
        """``table``'s interval rows, newest interval first: the ``latest`` ones, those
        starting in ``[since, until)``, only the incomplete ones (``incomplete``), or,
        with ``starts``, the incomplete ones and those starting at one of ``starts``."""
        rows = IntervalCompleteness
        query = select(rows).where(rows.table_name == table)
        if since is not None:
            query = query.where(rows.interval_start >= since)
        if until is not None:
            query = query.where(rows.interval_start < until)
        if starts:
            query = query.where(~rows.complete | rows.interval_start.in_(list(starts)))
        elif incomplete:
            query = query.where(~rows.complete)
        query = query.order_by(rows.interval_start.desc())
        if latest is not None:
            query = query.limit(latest)
        with self._session() as session:
            return [_interval_record(row) for row in session.scalars(query)]

    def intervals_completed_by(self, run_id: str, table: str) -> list[IntervalRecord]:
        """The intervals of ``table`` that run ``run_id`` completed, oldest first."""
        rows = IntervalCompleteness
        query = (
            select(rows)
            .where(rows.table_name == table, rows.completed_run_id == run_id, rows.complete)
            .order_by(rows.interval_start)
        )
        with self._session() as session:
            return [_interval_record(row) for row in session.scalars(query)]


_RECORD_FIELDS = (
    "interval_end",
    "tuples",
    "waiting",
    "quarantined",
    "oldest_waiting_entered_at",
    "complete",
    "completed_at",
    "completed_run_id",
    "run_id",
)


def _interval_record(row: IntervalCompleteness) -> IntervalRecord:
    return IntervalRecord(
        row.table_name,
        row.interval_start,
        **{name: getattr(row, name) for name in _RECORD_FIELDS},
    )
