"""SSBJ cost model: Eq. 1-3, the least-squares fit, and the planner's invariant."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.cache.cost_model import (
    MemoryParams,
    StepCosts,
    StepMeasurement,
    fit_step_costs,
    loop_seconds,
    memory_bytes,
    plan,
    service_rate,
)

MEMORY = MemoryParams(stream_bytes=50, master_bytes=120, pointer_bytes=8, fudge=1.0)


def test_equation_1_by_hand() -> None:
    # b = 100, h_R = 10, w_S = 5, R_t = 1000: (100 + 10)·120 + 5·(1000/100)·(8 + 50)
    assert memory_bytes(100, 10, 5, 1000, MEMORY) == 110 * 120 + 5 * 10 * 58


def test_fit_recovers_the_costs_that_generated_the_steps() -> None:
    truth = StepCosts(overhead=0.8, per_master_row=2e-6, per_cache_tuple=1e-6, per_disk_tuple=5e-6)
    steps = [
        StepMeasurement(b, wn, ws, loop_seconds(b, wn, ws, truth))
        for b, wn, ws in [
            (1e5, 0, 1e4),
            (5e4, 1e4, 1e4),
            (2e5, 5e3, 0),
            (1e5, 2e4, 3e4),
            (3e4, 0, 0),
        ]
    ]
    fitted = fit_step_costs(steps)
    for name in ("overhead", "per_master_row", "per_cache_tuple", "per_disk_tuple"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6)


costs = st.builds(
    StepCosts,
    st.floats(0.01, 2.0),
    st.floats(1e-8, 1e-5),
    st.floats(1e-8, 1e-5),
    st.floats(1e-8, 1e-5),
)


@given(costs, st.floats(10, 50_000), st.floats(0.0, 1.0), st.integers(1_000, 2_000_000))
def test_plan_keeps_up_and_uses_least_memory(
    c: StepCosts, rate: float, share: float, rows: int
) -> None:
    candidates = (1, 2, 4, 8, 16, 32)
    try:
        chosen = plan(rows, rate, share, 0.0, c, MEMORY, 60.0, candidates=candidates)
    except ValueError:
        return
    assert chosen.service_rate >= rate * (1 - 1e-9)
    for k in candidates:
        if k > rows:
            continue
        b = rows / k
        slope = share * c.per_cache_tuple + (1 - share) * c.per_disk_tuple
        if rate * slope >= 1:
            continue
        w = max(1.0, rate * (c.overhead + c.per_master_row * b) / (1 - rate * slope))
        other = memory_bytes(b, 0.0, (1 - share) * w, rows, MEMORY)
        assert chosen.memory_bytes <= other * (1 + 1e-9)
    assert chosen.steps_per_run == max(1, math.ceil(60.0 / chosen.step_seconds))
    assert chosen.service_rate == pytest.approx(
        service_rate(
            share * chosen.tuples_per_step,
            (1 - share) * chosen.tuples_per_step,
            chosen.step_seconds,
        )
    )


def test_plan_refuses_an_impossible_rate() -> None:
    slow = StepCosts(1.0, 1e-6, 1e-3, 1e-3)
    with pytest.raises(ValueError, match="keeps up"):
        plan(10_000, 5_000, 0.5, 0, slow, MEMORY, 60)
