"""The least SSBJ state at a rate (``joins/ssbj/cache/least_state.py``): Theorem 1's
placement against every other split of the values, and MESHJOIN's state beside it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joins.ssbj.cache.inequality import TupleSizes, cache_is_cheaper
from joins.ssbj.cache.least_state import least_state

SIZES = TupleSizes(stream_bytes=50.0, master_bytes=60.0)

values = st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 6)), min_size=1, max_size=8).map(
    lambda pairs: ([p / max(1.0, sum(q for q, _ in pairs)) for p, _ in pairs], pairs)
)


@settings(max_examples=150, deadline=None)
@given(values, st.floats(0.0, 1e5), st.floats(0.0, 1e4), st.data())
def test_no_split_of_the_values_holds_less(
    drawn: tuple[list[float], list[tuple[float, int]]],
    tuples: float,
    buffer_rows: float,
    data: st.DataObject,
) -> None:
    probabilities, pairs = drawn
    rows = [m for _, m in pairs]
    bound = least_state(probabilities, rows, tuples, buffer_rows, SIZES)
    unlisted = max(0.0, 1.0 - sum(probabilities)) * tuples * SIZES.stream_bytes
    # Any split: each value in the cache (its master rows) or in H_S (its expected tuples).
    split = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    held = sum(
        m * SIZES.master_bytes if cached else tuples * p * SIZES.stream_bytes
        for p, m, cached in zip(probabilities, rows, split, strict=True)
    )
    other = buffer_rows * SIZES.master_bytes + held + unlisted
    assert bound.ssbj_bytes <= other + 1e-6 * max(1.0, other)
    assert bound.ssbj_bytes <= bound.meshjoin_bytes + 1e-6 * max(1.0, bound.meshjoin_bytes)
    assert bound.meshjoin_bytes == pytest.approx(
        buffer_rows * SIZES.master_bytes + tuples * SIZES.stream_bytes
    )
    cached = [
        p
        for p, m in zip(probabilities, rows, strict=True)
        if cache_is_cheaper(m, tuples * p, SIZES)
    ]
    assert bound.cached_values == len(cached)
    assert bound.cache_share == pytest.approx(sum(cached))


def test_a_worked_case() -> None:
    # Two values, 100 tuples a cycle: the hot one (80 tuples, 4,000 B in H_S) is cheaper
    # in the cache (2 rows, 120 B); the cold one (20 tuples, 1,000 B) is not (20 rows,
    # 1,200 B). Disk buffer: 10 rows, 600 B.
    bound = least_state([0.8, 0.2], [2, 20], 100, 10, SIZES)
    assert (bound.ssbj_bytes, bound.meshjoin_bytes) == (600 + 120 + 1000, 600 + 5000)
    assert (bound.cached_values, bound.cache_share) == (1, 0.8)
    assert bound.ratio == pytest.approx(5600 / 1720)


def test_bad_input_names_what_was_expected() -> None:
    with pytest.raises(ValueError, match="one master row count per value"):
        least_state([0.5, 0.5], [1], 10, 0, SIZES)
    with pytest.raises(ValueError, match="must be >= 0"):
        least_state([1.0], [1], -1, 0, SIZES)
