"""``mode: auto``'s rule for equi stages: SSBJ only where the freshness bound lets a cycle
span runs, for a large master, not much smaller than the batch."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.choice import EquiSizes, choose_equi_mode

GIB = 1024**3


def test_a_master_within_the_byte_threshold_is_joined_whole() -> None:
    choice = choose_equi_mode(EquiSizes(GIB, 10**9, 1), 8 * GIB, 40, 2)
    assert choice.mode == "baseline"
    assert "ssbj_above_bytes" in choice.reason


def test_a_large_master_under_the_batches_rule_is_joined_whole() -> None:
    choice = choose_equi_mode(EquiSizes(9 * GIB, 1_000_000, 200_000), 8 * GIB, 40, 2)
    assert choice.mode == "baseline"
    assert "ssbj_master_batches" in choice.reason


def test_a_large_master_over_the_batches_rule_gets_ssbj() -> None:
    choice = choose_equi_mode(EquiSizes(9 * GIB, 80_000_000, 20_000), 8 * GIB, 40, 2)
    assert choice.mode == "ssbj"
    assert "80,000,000 rows" in choice.reason


def test_without_record_counts_the_bytes_decide() -> None:
    choice = choose_equi_mode(EquiSizes(9 * GIB, None, 10**9), 8 * GIB, 40, 2)
    assert choice.mode == "ssbj"
    assert "no record counts" in choice.reason and "ssbj_master_batches" not in choice.reason


sizes = st.builds(
    EquiSizes,
    master_bytes=st.integers(0, 2**40),
    master_rows=st.one_of(st.none(), st.integers(0, 10**10)),
    batch_rows=st.integers(0, 10**8),
)


@given(sizes, st.integers(0, 2**40), st.floats(0.01, 1000), st.integers(1, 16))
def test_ssbj_is_chosen_exactly_when_all_three_conditions_hold(
    given_sizes: EquiSizes, above: int, batches: float, cycle_runs: int
) -> None:
    choice = choose_equi_mode(given_sizes, above, batches, cycle_runs)
    large = given_sizes.master_bytes > above
    enough_rows = given_sizes.master_rows is None or given_sizes.master_rows >= batches * max(
        given_sizes.batch_rows, 1
    )
    assert (choice.mode == "ssbj") == (large and enough_rows and cycle_runs >= 2)


def test_a_bound_of_one_run_joins_whole_even_a_huge_master() -> None:
    choice = choose_equi_mode(EquiSizes(900 * GIB, 8 * 10**9, 20_000), 0, 0.25, 1)
    assert choice.mode == "baseline"
    assert "freshness" in choice.reason and "whole master each run" in choice.reason


@given(sizes, st.integers(0, 2**40), st.floats(0.01, 1000), st.integers(0, 2**30))
def test_a_larger_master_never_moves_ssbj_back_to_the_plain_join(
    given_sizes: EquiSizes, above: int, batches: float, grow: int
) -> None:
    bigger = EquiSizes(
        given_sizes.master_bytes + grow,
        None if given_sizes.master_rows is None else given_sizes.master_rows + grow,
        given_sizes.batch_rows,
    )
    if choose_equi_mode(given_sizes, above, batches, 2).mode == "ssbj":
        assert choose_equi_mode(bigger, above, batches, 2).mode == "ssbj"
