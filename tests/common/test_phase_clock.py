"""The phase clock charges every instant to exactly one phase, the innermost open one."""

from __future__ import annotations

from contextlib import ExitStack

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.phase_clock import OTHER, TOTAL, PhaseClock


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# A script: open a phase (name), close the innermost one (None), or let time pass (float).
Action = st.one_of(
    st.sampled_from(["read", "write", "commit"]),
    st.none(),
    st.floats(min_value=0.0, max_value=100.0, allow_nan=False),
)


@given(st.lists(Action, max_size=40), st.floats(min_value=0.0, max_value=50.0))
def test_phases_sum_to_the_wall_time_and_nesting_pauses_the_outer_phase(
    script: list[str | float | None], before: float
) -> None:
    time = FakeTime()
    clock = PhaseClock(now=time)
    clock.add("session_start", before)
    expected: dict[str, float] = {"session_start": before}
    with ExitStack() as stack:
        opened: list[ExitStack] = []
        names: list[str] = []
        for action in script:
            if isinstance(action, str):
                inner = ExitStack()
                inner.enter_context(clock.phase(action))
                opened.append(inner)
                names.append(action)
            elif action is None:
                if opened:
                    opened.pop().close()
                    names.pop()
            else:
                time.now += action
                current = names[-1] if names else OTHER
                expected[current] = expected.get(current, 0.0) + action
        for inner in opened:  # the stack closes the last pushed, the innermost, first
            stack.push(inner.__exit__)
    seen = clock.seconds()
    for name in set(seen) | set(expected):
        assert seen.get(name, 0.0) == pytest.approx(expected.get(name, 0.0), abs=1e-6), name
    assert clock.total() == pytest.approx(time.now + before, abs=1e-6)
    assert sum(seen.values()) == pytest.approx(clock.total(), abs=1e-6)


def test_an_error_inside_a_phase_still_closes_it() -> None:
    time = FakeTime()
    clock = PhaseClock(now=time)
    with pytest.raises(RuntimeError), clock.phase("write"):
        time.now += 2.0
        raise RuntimeError("the write failed")
    time.now += 3.0
    assert clock.seconds() == {"write": 2.0, OTHER: 3.0}


def test_bad_phases_are_refused() -> None:
    clock = PhaseClock()
    for reserved in (OTHER, TOTAL):
        with pytest.raises(ValueError, match="expected a phase name"), clock.phase(reserved):
            pass
        with pytest.raises(ValueError, match="expected a phase name"):
            clock.add(reserved, 1.0)
    with pytest.raises(ValueError, match="seconds >= 0"):
        clock.add("session_start", -1.0)
