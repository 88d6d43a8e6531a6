"""Where a task's wall time went: an exclusive clock over named phases.

Invariant: every instant between ``start`` and ``stop`` is charged to exactly one phase,
the innermost one open at that instant, or to ``other`` when none is open. The phases
therefore sum to the task's wall time: a nested phase pauses the one around it instead of
being counted twice.

The pipeline opens phases at the few places where the work happens (the Spark jobs that
compute and write files, Delta log commits, Great Expectations runs); Spark plans are lazy,
so the read and the join of a stage run inside its write and are charged there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

OTHER = "other"
TOTAL = "total"
# How a task's timings are stored as run metrics: stage "task.<task>", names "seconds.<phase>".
TASK_PREFIX = "task."
SECONDS_PREFIX = "seconds."


class PhaseClock:
    """Accumulates seconds per phase; see the module docstring for the invariant."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._seconds: dict[str, float] = {}
        self._open: list[str] = []
        self._since = now()
        self._started = self._since

    def _charge(self) -> None:
        now = self._now()
        current = self._open[-1] if self._open else OTHER
        self._seconds[current] = self._seconds.get(current, 0.0) + (now - self._since)
        self._since = now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to ``name`` (pausing any enclosing phase)."""
        _check_name(name)
        self._charge()
        self._open.append(name)
        try:
            yield
        finally:
            self._charge()
            self._open.pop()

    def add(self, name: str, seconds: float) -> None:
        """Charge time measured before this clock started (e.g. the Spark session start)."""
        _check_name(name)
        if seconds < 0:
            raise ValueError(f"expected seconds >= 0 for phase {name!r}, got {seconds}")
        self._seconds[name] = self._seconds.get(name, 0.0) + seconds
        self._started -= seconds

    def seconds(self) -> dict[str, float]:
        """Seconds per phase so far, ``other`` included; they sum to :meth:`total`."""
        self._charge()
        return dict(self._seconds)

    def total(self) -> float:
        self._charge()
        return self._since - self._started


def _check_name(name: str) -> None:
    if name in (OTHER, TOTAL):
        raise ValueError(f"{name!r} is the clock's own name; expected a phase name")


@contextmanager
def optional_phase(clock: PhaseClock | None, name: str) -> Iterator[None]:
    """``clock.phase(name)``, or nothing when no clock is attached."""
    if clock is None:
        yield
        return
    with clock.phase(name):
        yield
