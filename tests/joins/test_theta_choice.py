"""``scheme: auto`` picks by the rules of joins/theta_choice.py, from counts and samples alone."""

from __future__ import annotations

import numpy as np
import pytest

from joins.key_sample import KeySample
from joins.theta_choice import bin_load, choose_by_counts, choose_scheme
from joins.theta_predicate import ThetaPredicate

BAND = ThetaPredicate(type="band", stream_column="x", master_column="y", eps=1.0)
RANGE = ThetaPredicate(type="range", stream_column="x", lo="lo", hi="hi")
LESS = ThetaPredicate(type="less", stream_column="x", master_column="y")
MB = 1024 * 1024


def uniform(rows: int, k: int = 2000, seed: int = 0) -> KeySample:
    keys = np.sort(np.random.default_rng(seed).uniform(0, 1e6, size=min(rows, k)))
    return KeySample(rows, rows, keys)


def hot(rows: int, share: float, k: int = 2000) -> KeySample:
    """``share`` of the rows on one key (500.0), the rest uniform."""
    keys = np.random.default_rng(1).uniform(0, 1e6, size=k)
    keys[: int(share * k)] = 500.0
    return KeySample(rows, rows, np.sort(keys))


def test_a_small_master_under_a_range_predicate_is_broadcast() -> None:
    choice = choose_scheme(RANGE, uniform(1_000_000), uniform(240), 40.0, 2, 10 * MB)
    assert choice.scheme == "spark", choice


@pytest.mark.parametrize("predicate", [RANGE, LESS])
def test_a_large_master_under_a_non_band_predicate_gets_adsp(predicate: ThetaPredicate) -> None:
    too_big = choose_scheme(predicate, uniform(10_000), uniform(1_000_000), 24.0, 2, 10 * MB)
    assert too_big.scheme == "adsp", too_big
    # Broadcastable, but 200k x 200k comparisons per core are over the budget.
    too_many = choose_scheme(predicate, uniform(400_000), uniform(200_000), 24.0, 2, 100 * MB)
    assert too_many.scheme == "adsp", too_many


def test_a_band_with_a_broadcastable_master_is_binned_even_when_hot() -> None:
    choice = choose_scheme(BAND, hot(1_000_000, 0.6), uniform(1000), 24.0, 64, 10 * MB)
    assert choice.scheme == "binning", choice


def test_a_band_without_hot_bins_is_binned() -> None:
    choice = choose_scheme(BAND, uniform(1_000_000), uniform(1_000_000, seed=2), 24.0, 64, 0.0)
    assert choice.scheme == "binning", choice


def test_a_hot_bin_goes_to_adsp_only_when_it_would_overload_a_task() -> None:
    stream, master = hot(1_000_000, 0.3), uniform(1_000_000, seed=2)
    load = bin_load(BAND, stream, master)
    assert load.busiest == pytest.approx(0.3 * 1_000_000, rel=0.01)
    # 2 tasks at once: the hot bin is less than half of all input rows.
    assert choose_scheme(BAND, stream, master, 24.0, 2, 0.0).scheme == "binning"
    # 64 tasks at once: it is far more than 1/64 of them.
    choice = choose_scheme(BAND, stream, master, 24.0, 64, 0.0)
    assert choice.scheme == "adsp" and "hot bin" in choice.reason


def test_master_rows_count_once_per_bin_their_band_reaches() -> None:
    master = KeySample(2, 2, np.array([0.5, 10.0]))  # eps 1: bins 0-1 and 4-5 (width 2)
    load = bin_load(BAND, KeySample(0, 0, np.empty(0)), master)
    assert load.total == 4.0 and load.busiest == 1.0


@pytest.mark.parametrize(
    ("predicate", "master_rows", "broadcast", "scheme"),
    [
        (RANGE, 240, 10 * MB, "spark"),
        (LESS, 1_000_000, 10 * MB, "adsp"),  # too large to broadcast: no sample changes that
        (BAND, 1000, 10 * MB, "binning"),
        (BAND, 1_000_000, 10 * MB, None),  # the keys decide: hot bin or not
    ],
)
def test_counts_alone_decide_every_rule_but_the_hot_bin(
    predicate: ThetaPredicate, master_rows: int, broadcast: float, scheme: str | None
) -> None:
    """``auto`` draws keys only when they can change the choice, and whenever the counts
    decide, the full rule set with samples decides the same."""
    stream, master = uniform(1_000_000), uniform(master_rows, seed=3)
    decided = choose_by_counts(predicate, stream.counts, master.counts, 24.0, 2, broadcast)
    assert (decided.scheme if decided else None) == scheme
    if decided is not None:
        assert choose_scheme(predicate, stream, master, 24.0, 2, broadcast) == decided
