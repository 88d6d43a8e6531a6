"""``mode: auto``'s rule for equi stages: SSBJ only where the freshness bound lets a cycle
span runs, for a large master, not much smaller than the batch, and, measured, no dearer
per tuple than the plain join."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.choice import (
    MEASURED_MARGIN,
    EquiChoice,
    EquiSizes,
    ModeCost,
    choose_equi_mode,
    measured_choice,
)

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


SIZED_SSBJ = EquiChoice("ssbj", "the master is large")


def test_a_stage_that_never_ran_the_plain_join_runs_it_once_to_measure_it() -> None:
    choice = measured_choice(SIZED_SSBJ, None, None, 4, None, holds_tuples=False)
    assert choice.mode == "baseline" and "not measured" in choice.reason
    # Not while SSBJ holds tuples: the probe would drain them.
    assert measured_choice(SIZED_SSBJ, None, None, 4, "ssbj", holds_tuples=True) == SIZED_SSBJ


def test_ssbj_is_weighed_only_after_a_whole_r_cycle() -> None:
    plain = ModeCost(steps=1, tuples=1000, seconds=0.01)
    early = ModeCost(steps=3, tuples=1000, seconds=10.0)  # dear, but k = 4 steps not done
    choice = measured_choice(SIZED_SSBJ, early, plain, 4, "ssbj", holds_tuples=True)
    assert choice.mode == "ssbj" and "first R-cycle" in choice.reason
    done = ModeCost(steps=4, tuples=1000, seconds=10.0)
    choice = measured_choice(SIZED_SSBJ, done, plain, 4, "ssbj", holds_tuples=True)
    assert choice.mode == "baseline"
    assert "SSBJ 10000.0 us a tuple over 4 steps" in choice.reason
    assert "the plain join 10.0 us over 1" in choice.reason


def test_the_mode_that_ran_last_keeps_the_stage_within_the_margin() -> None:
    plain = ModeCost(steps=2, tuples=1000, seconds=1.0)
    slightly_dearer = ModeCost(steps=8, tuples=1000, seconds=1.05)
    assert measured_choice(SIZED_SSBJ, slightly_dearer, plain, 4, "ssbj", False).mode == "ssbj"
    assert measured_choice(SIZED_SSBJ, slightly_dearer, plain, 4, "baseline", False).mode == (
        "baseline"
    )
    slightly_cheaper = ModeCost(steps=8, tuples=1000, seconds=0.95)
    assert measured_choice(SIZED_SSBJ, slightly_cheaper, plain, 4, "baseline", False).mode == (
        "baseline"
    )
    assert measured_choice(SIZED_SSBJ, slightly_cheaper, plain, 4, "ssbj", False).mode == "ssbj"


costs = st.one_of(
    st.none(),
    st.builds(
        ModeCost,
        steps=st.integers(0, 100),
        tuples=st.floats(0, 1e6),
        seconds=st.floats(0, 1e4),
    ),
)


@given(
    st.sampled_from([SIZED_SSBJ, EquiChoice("baseline", "small")]),
    costs,
    costs,
    st.integers(1, 16),
    st.sampled_from(["ssbj", "baseline", None]),
    st.booleans(),
)
def test_measurements_only_take_ssbj_away_and_never_from_a_cheaper_measured_ssbj(
    sized: EquiChoice,
    ssbj: ModeCost | None,
    plain: ModeCost | None,
    k: int,
    last: Any,
    holds: bool,
) -> None:
    choice = measured_choice(sized, ssbj, plain, k, last, holds)
    if sized.mode == "baseline":
        assert choice == sized
        return
    ssbj_cost = ssbj.per_tuple() if ssbj is not None and ssbj.steps >= k else None
    plain_cost = plain.per_tuple() if plain is not None else None
    if choice.mode == "baseline" and plain_cost is not None:
        # The plain join replaces SSBJ only on measurements, SSBJ's over a whole cycle:
        # dearer per tuple, or, after a step of the plain join, not cheaper by the margin.
        assert ssbj_cost is not None
        assert ssbj_cost > plain_cost / (1 + MEASURED_MARGIN if last == "baseline" else 1)
    if ssbj_cost is not None and plain_cost is not None and last != "baseline":
        assert (choice.mode == "ssbj") == (
            ssbj_cost <= plain_cost * (1 + MEASURED_MARGIN) ** (last == "ssbj")
        )
    if plain_cost is None:
        assert choice.mode == ("ssbj" if holds else "baseline")
