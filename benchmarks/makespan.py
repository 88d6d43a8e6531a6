"""Makespan of measured tasks on P simulated executors (list scheduling).

Spark hands the tasks of a stage to free executor cores in task-index order, and a stage
starts when the stages it reads from have finished. :func:`stage_makespan` replays that
greedy rule (Graham's list scheduling) over measured task durations: each task goes to the
executor that becomes free first. A job's makespan is the sum of its stages' makespans,
a barrier between stages, which is how a shuffle separates them.

Bounds (Graham 1966), tested: ``max(max(d), sum(d) / P) <= makespan <= sum(d) / P + max(d)``.
One task that holds a hot key therefore bounds the makespan from below however many
executors there are. That is the skew A-DSP's join matrix is meant to remove.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def stage_makespan(durations: Sequence[float], executors: int) -> float:
    """Finish time of the last task when ``executors`` take tasks in order as they free up."""
    if executors < 1:
        raise ValueError(f"need at least one executor, got {executors}")
    free = [0.0] * min(executors, max(1, len(durations)))
    heapq.heapify(free)
    finish = 0.0
    for duration in durations:
        start = heapq.heappop(free)
        end = start + duration
        finish = max(finish, end)
        heapq.heappush(free, end)
    return finish


def job_makespan(stages: Sequence[Sequence[float]], executors: int) -> float:
    """Stages one after another (shuffle barriers), each list-scheduled on its own."""
    return sum(stage_makespan(tasks, executors) for tasks in stages)
