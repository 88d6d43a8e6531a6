"""A-DSP area dichotomy: exact cover of the candidate band, never worse than one area."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from joins.theta.adsp.areas import partition_areas
from joins.theta.adsp.scheme import varietal_scheme


@st.composite
def bands(draw: st.DrawFn) -> tuple[list[float], list[float], list[tuple[int, int]]]:
    n = draw(st.integers(1, 14))
    m = draw(st.integers(1, 14))
    rows = draw(st.lists(st.floats(0.5, 20), min_size=n, max_size=n))
    columns = draw(st.lists(st.floats(0.5, 20), min_size=m, max_size=m))
    width = draw(st.integers(0, m))
    intervals = []
    for i in range(n):
        center = round(i * (m - 1) / max(1, n - 1))
        first, last = max(0, center - width // 2), min(m - 1, center + width // 2)
        if draw(st.booleans()) and draw(st.booleans()):
            first, last = 1, 0  # a row without candidates
        intervals.append((first, last))
    return rows, columns, intervals


@given(bands(), st.floats(5, 80))
def test_every_candidate_cell_is_in_exactly_one_area(band: tuple, memory: float) -> None:
    rows, columns, intervals = band
    areas = partition_areas(rows, columns, intervals, memory)
    for i, (first, last) in enumerate(intervals):
        for j in range(first, last + 1):
            owners = [
                a
                for a in areas
                if a.first_row <= i <= a.last_row and a.first_column <= j <= a.last_column
            ]
            assert len(owners) == 1, (i, j, areas)
    candidate_rows = [i for i, (f, last) in enumerate(intervals) if f <= last]
    if candidate_rows:
        whole_columns = [j for f, last in intervals if f <= last for j in (f, last)]
        single = varietal_scheme(
            sum(rows[min(candidate_rows) : max(candidate_rows) + 1]),
            sum(columns[min(whole_columns) : max(whole_columns) + 1]),
            memory,
        ).tasks
        assert sum(a.tasks for a in areas) <= single
    else:
        assert areas == []


def test_a_narrow_band_splits_into_diagonal_areas() -> None:
    # 8 x 8 buckets of 1 byte, band of width 1 around the diagonal, V = 4: the whole band as
    # one area needs a 4 x 4 matrix; diagonal areas need far fewer tasks.
    intervals = [(max(0, i - 1), min(7, i + 1)) for i in range(8)]
    areas = partition_areas([1.0] * 8, [1.0] * 8, intervals, 4.0)
    assert sum(a.tasks for a in areas) < varietal_scheme(8, 8, 4).tasks
    assert [a.first_row for a in areas] == sorted(a.first_row for a in areas)
