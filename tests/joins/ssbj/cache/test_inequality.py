"""Cache inequality (Theorem 2) and the switch/evict rules of Algorithm 1."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.cache.inequality import (
    TupleSizes,
    cache_is_cheaper,
    estimated_master_rows,
    should_evict,
    should_switch_into_cache,
)

sizes = st.builds(
    TupleSizes,
    st.floats(min_value=1, max_value=1e4, allow_nan=False),
    st.floats(min_value=1, max_value=1e4, allow_nan=False),
)
counts = st.integers(min_value=0, max_value=10_000)


@given(counts, counts, sizes)
def test_switch_with_unit_factor_is_theorem_2(pending: int, rows: int, size: TupleSizes) -> None:
    if pending > 0:
        assert should_switch_into_cache(pending, rows, size, 1.0) == cache_is_cheaper(
            rows, pending, size
        )


@given(counts, counts, sizes, st.floats(min_value=0.1, max_value=10))
def test_hysteresis_only_makes_switching_harder(
    pending: int, rows: int, size: TupleSizes, factor: float
) -> None:
    if should_switch_into_cache(pending, rows, size, max(1.0, factor)):
        assert should_switch_into_cache(pending, rows, size, 1.0)


@given(counts, counts, sizes)
def test_a_value_is_never_both_switched_and_evicted_at_equal_rates(
    rows: int, hits: int, size: TupleSizes
) -> None:
    # With f_count/10 equal to the pending count n, switching and eviction are complements.
    switched = should_switch_into_cache(hits, rows, size)
    evicted = should_evict(rows, hits * 10, size)
    if hits > 0:
        assert switched != evicted


def test_values_without_master_rows_form_a_negative_cache() -> None:
    size = TupleSizes(stream_bytes=40, master_bytes=100)
    assert should_switch_into_cache(1, 0, size)  # any pending tuple makes m = 0 worth caching
    assert not should_evict(0, 1, size)  # still probed: kept
    assert should_evict(0, 0, size)  # no longer probed: both sides zero, evicted


def test_paper_example_partid_10_and_30() -> None:
    # Section 3: equal tuple sizes; partID 10 has 4 suppliers and 3 pending requests (stays
    # on disk), partID 30 has 2 suppliers and 3 requests (moves to the cache).
    size = TupleSizes(stream_bytes=1, master_bytes=1)
    assert not should_switch_into_cache(3, 4, size)
    assert should_switch_into_cache(3, 2, size)


def test_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TupleSizes(0, 1)


@given(st.integers(0, 1000), st.integers(1, 16), st.integers(1, 16))
def test_extrapolated_count_equals_the_count_when_every_partition_was_seen(
    rows: int, observed: int, k: int
) -> None:
    if observed > k:
        return
    estimate = estimated_master_rows(rows, observed, k)
    if rows == 0 and observed < k:
        assert estimate is None  # no row over part of the cycle: m is not known
        return
    assert estimate is not None and estimate >= rows
    if observed == k:
        assert estimate == rows


def test_a_value_never_observed_or_with_no_row_yet_has_no_estimate() -> None:
    """A foreign key's value has one master row, in one of k partitions: seen pending in
    3 of 10 partitions without it, its rows are unknown, not m = 0; seen in all 10
    without a row, it has none (the negative cache)."""
    assert estimated_master_rows(0, 0, 10) is None
    assert estimated_master_rows(0, 3, 10) is None
    assert estimated_master_rows(0, 10, 10) == 0
    assert estimated_master_rows(1, 5, 10) == 2.0
