"""Admission under the memory budget (Eq. 1): prefixes that fit, progress when empty."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.intake import OperatorMemory, admit, chunk_capacity

versions = st.lists(st.integers(0, 50), min_size=0, max_size=8).map(
    lambda rows: [(v + 3, r) for v, r in enumerate(rows)]
)


@given(versions, st.integers(0, 120), st.floats(0.0, 1.0), st.booleans())
def test_admits_the_longest_prefix_that_fits(
    candidates: list[tuple[int, int]], capacity: int, miss_rate: float, empty: bool
) -> None:
    chosen = admit(2, list(reversed(candidates)), capacity, miss_rate, nothing_pending=empty)
    taken = [(v, r) for v, r in candidates if v <= chosen.to_version]
    assert chosen.admitted_rows == sum(r for _, r in taken)
    assert chosen.backlog_rows == sum(r for _, r in candidates) - chosen.admitted_rows
    if chosen.forced:
        assert empty and taken == candidates[:1]
        assert taken[0][1] * miss_rate > capacity
    else:
        assert chosen.admitted_rows * miss_rate <= capacity
        following = [r for v, r in candidates if v == chosen.to_version + 1]
        if following:  # the next version would not have fitted
            assert (chosen.admitted_rows + following[0]) * miss_rate > capacity or (
                empty and chosen.to_version == candidates[0][0] and chosen.admitted_rows
            )


def test_a_version_larger_than_the_budget_runs_alone_only_when_nothing_is_pending() -> None:
    assert admit(0, [(1, 500), (2, 1)], 100, 1.0, nothing_pending=False).to_version == 0
    forced = admit(0, [(1, 500), (2, 1)], 100, 1.0, nothing_pending=True)
    assert (forced.to_version, forced.admitted_rows, forced.forced) == (1, 500, True)


def test_cache_hits_let_more_tuples_in_at_the_same_memory() -> None:
    meshjoin = admit(0, [(v, 10) for v in range(1, 21)], 50, 1.0, nothing_pending=False)
    ssbj = admit(0, [(v, 10) for v in range(1, 21)], 50, 0.25, nothing_pending=False)
    assert (meshjoin.admitted_rows, ssbj.admitted_rows) == (50, 200)


def test_capacity_is_eq_1_solved_for_the_new_chunk() -> None:
    sizes = TupleSizes(stream_bytes=10.0, master_bytes=40.0)
    memory = OperatorMemory(disk_buffer_rows=100, cache_rows=50, pending_rows=30)
    # k·w_S = (M - (b + h_R)·v_R) / v_S = (10_000 - 6_000) / 10 = 400 rows of H_S
    assert chunk_capacity(10_000, memory, sizes, partitions=4) == 100  # one of k chunks
    assert chunk_capacity(10_000, memory, sizes, partitions=1) == 370  # 30 still pending
    assert chunk_capacity(5_000, memory, sizes, partitions=1) == 0
    assert memory.bytes(sizes, new_pending=370) == 10_000
    with pytest.raises(ValueError, match="k >= 1"):
        chunk_capacity(10_000, memory, sizes, partitions=0)


@given(
    st.integers(0, 10_000),
    st.integers(0, 500),
    st.integers(0, 500),
    st.integers(0, 500),
    st.integers(1, 16),
    st.integers(0, 200),
)
def test_an_admitted_chunk_keeps_the_state_within_the_budget(
    budget: int, b: int, h_r: int, pending: int, k: int, s_b: int
) -> None:
    sizes = TupleSizes(stream_bytes=7.0, master_bytes=13.0)
    memory = OperatorMemory(b, h_r, pending, s_b)
    w = chunk_capacity(budget, memory, sizes, k)
    assert w >= 0
    if w > 0:
        assert memory.bytes(sizes, new_pending=w) <= budget


def test_rejects_versions_at_or_before_the_offset_and_bad_rates() -> None:
    with pytest.raises(ValueError, match="after the offset"):
        admit(5, [(5, 1)], 10, 1.0, nothing_pending=True)
    with pytest.raises(ValueError, match="miss rate"):
        admit(0, [(1, 1)], 10, 1.5, nothing_pending=True)


def test_the_switching_buffer_takes_room_as_h_r_does() -> None:
    """s_B's rows are held through the switching cycle and become H_R at the phase-out:
    counted beside H_R's, the chunk the budget admits is the one it admits once they have
    moved, and the state stays within M through the move."""
    sizes = TupleSizes(stream_bytes=10.0, master_bytes=40.0)
    collecting = OperatorMemory(disk_buffer_rows=100, cache_rows=50, pending_rows=0, switch_rows=25)
    moved = OperatorMemory(disk_buffer_rows=100, cache_rows=75, pending_rows=0)
    # k·w_S = (10_000 - (100 + 50 + 25)·40) / 10 = 300 rows of H_S
    assert chunk_capacity(10_000, collecting, sizes, partitions=1) == 300
    assert chunk_capacity(10_000, moved, sizes, partitions=1) == 300
    assert collecting.bytes(sizes, new_pending=300) == moved.bytes(sizes, new_pending=300)
    assert collecting.bytes(sizes, new_pending=300) == 10_000
    without = OperatorMemory(disk_buffer_rows=100, cache_rows=50, pending_rows=0)
    assert chunk_capacity(10_000, without, sizes, partitions=1) == 400  # s_B left out
    assert moved.bytes(sizes, new_pending=400) > 10_000  # ... is over M once it moves
