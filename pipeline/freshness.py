"""Freshness: how long a stage's tuples may wait for their answer, and what keeps the bound.

A stage states ``freshness.complete_within``: ``N interval(s)`` or a duration of at least
one schedule interval (a duration counts the whole intervals it spans). The default,
``1 interval``, is the warehouse user's expectation: every tuple an interval's run ingests
is answered and published by the end of that run.

Invariant (SSBJ's cycle, seeds/ssbj_semi_stream_balanced_join.txt Sec. 3 and Algorithm 1
lines 26-33): a tuple that enters H_S at step ``e`` has met all k master partitions after
step ``e + k - 1``, so it is answered then at the latest. With ``s`` steps a run and a bound
of ``B`` runs, a tuple that enters at its run's first step is answered within the bound iff
``s * B >= k``; the steps a run takes, unless the config sets them, are ``ceil(k / B)``.
Tuples that enter later in a run (a memory budget admits input step by step) are caught by
the run's closing steps (:func:`due_before`). A late-master wait ``W`` holds a tuple up to
``W``, so it must fit the bound: ``W <= B * interval``.

The continuous mode (``enrich stream``) keeps the same bound on a clock of its own: a
micro-batch every trigger ``T`` lists the landing zones and takes one step of every stage,
so a cold tuple that lands just after a micro-batch's listing enters H_S at the next one
(within ``T``) and is answered ``k - 1`` steps later: within ``k T`` plus the last
micro-batch's work, so within ``(k + 1) T`` while a micro-batch is shorter than ``T``. A
stateless stage answers at its step: ``2 T``. :func:`stream_trigger` takes the
longest ``T`` that keeps every stage's ``freshness.stream_within`` (or, unset, its
``complete_within``): the master is then read once per bound, as often as a plain join
run once per bound reads it, while hot keys are answered a trigger after they land.

Plain Python, no Spark: the config validates with it and the operator steps by it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from pydantic import Field, field_validator

from common.durations import parse_duration
from common.model import Strict

INTERVALS = re.compile(r"^(\d+)\s*intervals?$")
DEFAULT_BOUND = "1 interval"


class Freshness(Strict):
    """``stages[].freshness``: the stage's completeness contract."""

    complete_within: str = Field(
        default=DEFAULT_BOUND,
        description=(
            "how long a tuple may wait for its answer: `N interval(s)` of the schedule, or a "
            "duration (30m, 2h, 1d) of at least one interval. 1 interval (the default): "
            "every tuple an interval's run ingests is answered and published by the end of "
            "that run. Longer bounds let SSBJ spread its R-cycle over several runs, reading "
            "a slice of the master each run"
        ),
    )

    stream_within: str | None = Field(
        default=None,
        description=(
            "in the continuous mode (`enrich stream`): how long a tuple may wait from landing "
            "to gold, a duration (90s, 10m). The stream's trigger follows from it (SSBJ: "
            "bound / (k + 1)). Unset: complete_within's duration"
        ),
    )

    @field_validator("stream_within")
    @classmethod
    def _duration(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            seconds = parse_duration(value.strip()).total_seconds()
        except ValueError as e:
            raise ValueError(f"expected a duration like 90s, 10m or 1h, got {value!r}") from e
        if seconds <= 0:
            raise ValueError(f"expected a bound longer than zero, got {value!r}")
        return value.strip()

    def stream_bound(self, interval: timedelta) -> timedelta:
        """The continuous mode's bound: ``stream_within``, else ``complete_within``'s
        duration under a schedule of ``interval``."""
        if self.stream_within is not None:
            return parse_duration(self.stream_within)
        match = INTERVALS.match(self.complete_within)
        if match:
            return int(match.group(1)) * interval
        return parse_duration(self.complete_within)

    @field_validator("complete_within")
    @classmethod
    def _form(cls, value: str) -> str:
        text = value.strip()
        match = INTERVALS.match(text)
        if match:
            if int(match.group(1)) < 1:
                raise ValueError(f"expected at least 1 interval, got {value!r}")
            return text
        try:
            if parse_duration(text).total_seconds() <= 0:
                raise ValueError(f"expected a bound longer than zero, got {value!r}")
        except ValueError as e:
            raise ValueError(
                f"expected `N interval(s)` or a duration like 30m, 2h or 1d, got {value!r}"
            ) from e
        return text

    def bound(self, interval: timedelta) -> FreshnessBound:
        """The bound in whole runs of a schedule of ``interval``; a ValueError when it is
        shorter than one run (a scheduled run answers a tuple at its end at the earliest)."""
        match = INTERVALS.match(self.complete_within)
        if match:
            return FreshnessBound(int(match.group(1)), interval)
        duration = parse_duration(self.complete_within)
        runs = duration // interval
        if runs < 1:
            raise ValueError(
                f"{self.complete_within} is shorter than the schedule's interval "
                f"({_human(interval)}): a scheduled run answers a tuple at the end of the run "
                "after it lands, at the earliest; set at least `1 interval`, or a shorter "
                "schedule.interval"
            )
        return FreshnessBound(int(runs), interval)


@dataclass(frozen=True)
class FreshnessBound:
    """A bound of ``intervals`` scheduled runs of ``interval`` each."""

    intervals: int
    interval: timedelta

    @property
    def duration(self) -> timedelta:
        return self.intervals * self.interval

    def describe(self) -> str:
        runs = "1 interval" if self.intervals == 1 else f"{self.intervals} intervals"
        return f"{runs} ({_human(self.duration)})"


def steps_for_bound(partitions: int, bound: FreshnessBound) -> int:
    """The fewest SSBJ steps a run takes so that a tuple entering at a run's first step meets
    all ``partitions`` (k) master partitions within the bound: ``ceil(k / B)``."""
    return math.ceil(partitions / bound.intervals)


def check_steps(partitions: int, steps_per_run: int, bound: FreshnessBound) -> None:
    """A ValueError, naming the numbers, when ``steps_per_run`` cannot keep the bound."""
    if steps_per_run * bound.intervals >= partitions:
        return
    runs_needed = math.ceil(partitions / steps_per_run)
    raise ValueError(
        f"{steps_per_run} step(s) a run over a bound of {bound.describe()} give a tuple "
        f"{steps_per_run * bound.intervals} step(s), but SSBJ's R-cycle needs k = {partitions} "
        f"(operator.partitions) to answer it; set steps_per_run to at least "
        f"{steps_for_bound(partitions, bound)} (or leave it unset: derived from the bound), "
        f"or freshness.complete_within to at least {runs_needed} intervals"
    )


def check_late_wait(wait: timedelta, bound: FreshnessBound) -> None:
    """A ValueError when a late-master wait outlasts the bound."""
    if wait <= bound.duration:
        return
    raise ValueError(
        f"a tuple may wait {_human(wait)} for a late master row (operator.late_master.wait), "
        f"longer than the stage's freshness bound of {bound.describe()}; shorten the wait or "
        f"set freshness.complete_within to at least {math.ceil(wait / bound.interval)} intervals"
    )


@dataclass(frozen=True)
class StreamNeed:
    """One stage's demand on the stream's trigger: answered within ``triggers`` triggers
    (``k + 1`` for SSBJ, 2 for a stateless stage), bound ``bound``."""

    stage: str
    triggers: int
    bound: timedelta

    @property
    def longest_trigger(self) -> timedelta:
        return self.bound / self.triggers


STREAM_SLACK_TRIGGERS = 1
"""Triggers a tuple may wait beyond its stage's steps: until the clock's next listing sees
its file, the last micro-batch's own work fitting in it."""


def stream_need(stage: str, partitions: int | None, bound: timedelta) -> StreamNeed:
    """A stage's need: an SSBJ stage of k = ``partitions`` answers a tuple ``k - 1`` steps
    after it enters; a stateless stage (``partitions`` None) at the step it enters."""
    steps = partitions if partitions is not None else 1
    return StreamNeed(stage, steps + STREAM_SLACK_TRIGGERS, bound)


def stream_trigger(needs: Sequence[StreamNeed], trigger: timedelta | None = None) -> timedelta:
    """The stream's trigger: ``trigger`` when given and it keeps every stage's bound, else
    the longest that keeps them all. A ValueError names the stage and the numbers when a
    given trigger cannot keep a bound."""
    if not needs:
        raise ValueError("the pipeline has no stage to step")
    tightest = min(needs, key=lambda n: n.longest_trigger)
    if trigger is None:
        return tightest.longest_trigger
    if trigger <= timedelta(0):
        raise ValueError(f"expected a trigger longer than zero, got {_human(trigger)}")
    for need in needs:
        if trigger * need.triggers > need.bound:
            raise ValueError(
                f"a trigger of {_human(trigger)} lets a tuple of stage {need.stage} wait up to "
                f"{need.triggers} triggers ({_human(trigger * need.triggers)}), longer than its "
                f"stream bound of {_human(need.bound)} (freshness.stream_within, or "
                f"complete_within); set a trigger of at most {_human(need.longest_trigger)}, "
                "or leave it out to derive it"
            )
    return trigger


def due_before(run_starts: Sequence[int], next_step: int, bound: FreshnessBound) -> int:
    """Entry steps below this are due by the end of the current run.

    ``run_starts`` holds the first step of each recent run, the current run's last. A tuple
    is due at the end of the ``B``-th run counted from the one it entered in: with
    ``B = 1`` every tuple pending now is due (``next_step``); otherwise those that entered
    before the first step of the run ``B - 2`` runs back. Before that many runs are known,
    none is due.
    """
    if bound.intervals == 1:
        return next_step
    back = bound.intervals - 1
    if len(run_starts) < back:
        return 0  # steps count from 0: no entry step is below it
    return run_starts[-back]


def _human(delta: timedelta) -> str:
    if delta.total_seconds() != int(delta.total_seconds()):
        return f"{delta.total_seconds():.3g}s"
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds % size == 0 and seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
