"""List scheduling of measured tasks (benchmarks/makespan.py) keeps Graham's bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.makespan import job_makespan, stage_makespan


@given(
    durations=st.lists(st.floats(0, 100, allow_nan=False), max_size=60),
    executors=st.integers(1, 70),
)
def test_list_scheduling_keeps_grahams_bounds(durations: list[float], executors: int) -> None:
    span = stage_makespan(durations, executors)
    longest = max(durations, default=0.0)
    average = sum(durations) / executors
    assert max(longest, average) <= span + 1e-9
    assert span <= average + longest + 1e-9


def test_tasks_go_to_the_first_free_executor_in_order() -> None:
    # Executor A takes 5, B takes 1 then 1 then 1: done at 5, not at 8 (one queue) or 4.
    assert stage_makespan([5.0, 1.0, 1.0, 1.0], 2) == 5.0
    assert stage_makespan([1.0, 1.0, 1.0, 5.0], 2) == 6.0  # the long task comes last
    assert stage_makespan([3.0, 3.0], 1) == 6.0


def test_a_hot_task_bounds_the_makespan_however_many_executors() -> None:
    tasks = [50.0] + [1.0] * 200
    assert stage_makespan(tasks, 256) == 50.0
    assert stage_makespan(tasks, 2) == pytest.approx(125.0)


def test_stages_are_separated_by_barriers() -> None:
    assert job_makespan([[2.0, 2.0], [1.0, 1.0, 1.0]], 2) == 2.0 + 2.0


def test_no_executors_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one executor"):
        stage_makespan([1.0], 0)
