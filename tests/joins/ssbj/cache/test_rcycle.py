"""The R-cycle state machine: states, partitions and expiry."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.cache.rcycle import CycleState, StepPosition


@given(st.integers(min_value=1, max_value=20), st.integers(min_value=0, max_value=50))
def test_a_tuple_meets_every_partition_once_before_it_expires(k: int, entry: int) -> None:
    seen = [StepPosition(s, k).partition for s in range(entry, entry + k)]
    assert sorted(seen) == list(range(k))
    assert StepPosition(entry + k - 1, k).expiring_entry_step() == entry


@given(st.integers(min_value=1, max_value=12))
def test_states_cycle_incrementing_switching_phase_out(k: int) -> None:
    states = [StepPosition(s, k).state for s in range(0, 6 * k, k)]
    assert states == [
        CycleState.INCREMENTING,
        CycleState.SWITCHING,
        CycleState.PHASE_OUT,
        CycleState.INCREMENTING,
        CycleState.SWITCHING,
        CycleState.PHASE_OUT,
    ]
    assert all(StepPosition(s, k).state == StepPosition(s - s % k, k).state for s in range(6 * k))


@given(st.integers(min_value=1, max_value=8))
def test_eviction_runs_at_the_start_of_every_tenth_cycle(k: int) -> None:
    evicting = [s for s in range(25 * k) if StepPosition(s, k).evicts]
    assert evicting == [9 * k, 19 * k]  # cycles 10 and 20 (cycles count from 1)


@given(st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=12))
def test_eviction_period_is_the_configured_number_of_cycles(k: int, period: int) -> None:
    evicting = [s for s in range(3 * period * k) if StepPosition(s, k, period).evicts]
    assert evicting == [(c - 1) * k for c in (period, 2 * period, 3 * period)]
