"""A-DSP scheme generation (Alg. 1, Equ. 9-13): worked example and invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joins.theta.adsp.scheme import dynamic_tasks, square_tasks, varietal_scheme


def test_figure_4_gives_1_2_1_row() -> None:
    # V = 10, |ca^r| = 9, |ca^s| = 7: S is primary, <α, β, P_δ, +> = <1, 2, 1, row>, 3 tasks
    scheme = varietal_scheme(9, 7, 10)
    assert (scheme.rows, scheme.columns, scheme.extra_cells, scheme.extra_side) == (1, 2, 1, "row")
    assert scheme.tasks == 3
    assert square_tasks(9, 7, 10) == 4  # Fig. 4(a): the regular 2 x 2 matrix
    assert scheme.task_loads() == pytest.approx([10, 10, 9.5])  # Fig. 4(b): TaskA_10 holds 9.5


def test_figure_3_square_matrix() -> None:
    assert square_tasks(6, 6, 10) == 4


volumes = st.floats(min_value=0.0, max_value=500.0, allow_nan=False)


@given(volumes, volumes, st.floats(min_value=1.0, max_value=100.0))
def test_varietal_respects_memory_and_never_beats_equ_9_upwards(
    r: float, s: float, v: float
) -> None:
    scheme = varietal_scheme(r, s, v)
    assert scheme.tasks <= square_tasks(r, s, v)
    assert all(load <= v * (1 + 1e-9) for load in scheme.task_loads())
    assert scheme.extra_cells <= scheme.primary_divisions


@given(volumes, volumes, st.floats(min_value=1.0, max_value=100.0))
def test_dynamic_uses_at_least_the_square_matrix(r: float, s: float, v: float) -> None:
    assert dynamic_tasks(r, s, v) >= square_tasks(r, s, v)
