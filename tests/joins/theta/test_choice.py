"""``scheme: auto`` picks by the rules of joins/theta/choice.py, from size estimates, counts and
samples alone."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from joins.theta.choice import (
    SAMPLE_ABOVE_BYTES,
    ClusterFigures,
    bin_load,
    choose_by_counts,
    choose_by_size,
    choose_scheme,
)
from joins.theta.key_sample import KeySample, SideCounts
from joins.theta.predicate import ThetaPredicate

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
    choice = choose_scheme(
        RANGE, uniform(1_000_000), uniform(240), 40.0, ClusterFigures(2, 10 * MB)
    )
    assert choice.scheme == "spark", choice


@pytest.mark.parametrize("predicate", [RANGE, LESS])
def test_a_large_master_under_a_non_band_predicate_gets_adsp(predicate: ThetaPredicate) -> None:
    too_big = choose_scheme(
        predicate, uniform(10_000), uniform(1_000_000), 24.0, ClusterFigures(2, 10 * MB)
    )
    assert too_big.scheme == "adsp", too_big
    # Broadcastable, but 200k x 200k comparisons per core are over the budget.
    too_many = choose_scheme(
        predicate, uniform(400_000), uniform(200_000), 24.0, ClusterFigures(2, 100 * MB)
    )
    assert too_many.scheme == "adsp", too_many


def test_a_band_with_a_broadcastable_master_is_binned_even_when_hot() -> None:
    choice = choose_scheme(
        BAND, hot(1_000_000, 0.6), uniform(1000), 24.0, ClusterFigures(64, 10 * MB)
    )
    assert choice.scheme == "binning", choice


def test_a_band_without_hot_bins_is_binned() -> None:
    choice = choose_scheme(
        BAND, uniform(1_000_000), uniform(1_000_000, seed=2), 24.0, ClusterFigures(64, 0.0)
    )
    assert choice.scheme == "binning", choice


def test_a_hot_bin_goes_to_adsp_only_when_it_would_overload_a_task() -> None:
    stream, master = hot(1_000_000, 0.3), uniform(1_000_000, seed=2)
    load = bin_load(BAND, stream, master)
    assert load.busiest == pytest.approx(0.3 * 1_000_000, rel=0.01)
    # 2 tasks at once: the hot bin is less than half of all input rows.
    assert choose_scheme(BAND, stream, master, 24.0, ClusterFigures(2, 0.0)).scheme == "binning"
    # 64 tasks at once: it is far more than 1/64 of them.
    choice = choose_scheme(BAND, stream, master, 24.0, ClusterFigures(64, 0.0))
    assert choice.scheme == "adsp" and "hot bin" in choice.reason


@pytest.mark.parametrize(("tasks", "scheme"), [(4, "binning"), (8, "adsp")])
def test_a_hot_bin_must_outweigh_adsps_extra_work(tasks: int, scheme: str) -> None:
    """The hot bin holds ~30% of ~3M input rows (the master counts twice). Over 4 tasks
    that is more than a fair share (25%) but less than A-DSP's 1.5x work spread over
    them (37.5%): binning stays. Over 8 tasks (18.75%) A-DSP wins."""
    stream, master = hot(1_000_000, 0.9), uniform(1_000_000, seed=2)
    load = bin_load(BAND, stream, master)
    assert load.total / 4 < load.busiest < 1.5 * load.total / 4
    assert choose_scheme(BAND, stream, master, 24.0, ClusterFigures(tasks, 0.0)).scheme == scheme
    # With no extra work assumed, the fair share alone would have sent 4 tasks to A-DSP.
    assert (
        choose_scheme(BAND, stream, master, 24.0, ClusterFigures(4, 0.0, adsp_work=1.0)).scheme
        == "adsp"
    )


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
    decided = choose_by_counts(
        predicate, stream.counts, master.counts, 24.0, ClusterFigures(2, broadcast)
    )
    assert (decided.scheme if decided else None) == scheme
    if decided is not None:
        assert (
            choose_scheme(predicate, stream, master, 24.0, ClusterFigures(2, broadcast)) == decided
        )


@dataclass(frozen=True)
class Size:
    """An optimizer estimate, as ``warehouse.spark.plan_size`` returns it."""

    bytes: float
    rows: int | None = None


def test_a_small_band_join_bins_on_its_estimate_and_a_large_one_is_left_to_the_keys() -> None:
    small = choose_by_size(BAND, Size(1 * MB), Size(4 * MB), ClusterFigures(2, 0.0))
    assert small is not None and small.scheme == "binning"
    assert "sample_above_bytes" in small.reason
    # 1 + 2 x 8 MiB: binning replicates the master, so it counts twice and crosses 16 MiB.
    assert choose_by_size(BAND, Size(1 * MB), Size(8 * MB), ClusterFigures(2, 0.0)) is None
    # 0 turns the rule off: a tiny band join against an unbroadcastable master samples.
    assert (
        choose_by_size(BAND, Size(10.0), Size(10.0), ClusterFigures(2, 0.0, sample_above_bytes=0))
        is None
    )
    broadcast = choose_by_size(BAND, Size(100 * MB), Size(1 * MB), ClusterFigures(2, 10 * MB, 0))
    assert broadcast is not None and broadcast.scheme == "binning"
    assert "broadcast" in broadcast.reason


@pytest.mark.parametrize(
    ("stream", "master", "expected"),
    [
        (Size(320_000, 20_000), Size(5_760, 240), "spark"),
        (Size(320_000, None), Size(5_760, 240), None),  # rows unknown: count them
        (Size(320_000, 20_000), Size(5_760, None), None),
        (Size(320_000, 20_000), Size(20 * MB, 240), None),  # not broadcastable
        (Size(32 * MB, 2_000_000), Size(4 * MB, 1_000), None),  # 1e9 comparisons per core
    ],
)
def test_the_nested_loop_is_chosen_on_estimates_only_with_both_row_counts(
    stream: Size, master: Size, expected: str | None
) -> None:
    choice = choose_by_size(RANGE, stream, master, ClusterFigures(2, 10 * MB))
    assert (choice.scheme if choice else None) == expected


@given(
    predicate=st.sampled_from([BAND, RANGE, LESS]),
    stream_rows=st.integers(0, 10**8),
    master_rows=st.integers(0, 10**7),
    row_bytes=st.floats(1.0, 200.0),
    cores=st.integers(1, 512),
    broadcast=st.sampled_from([0.0, 1 * MB, 10 * MB, 1024 * MB]),
)
def test_sizes_decide_as_the_exact_counts_would_when_they_hold_the_counts(
    predicate: ThetaPredicate,
    stream_rows: int,
    master_rows: int,
    row_bytes: float,
    cores: int,
    broadcast: float,
) -> None:
    """With the small-join rule off, an estimate that holds the exact rows (and the bytes
    those rows take) never decides differently from counting them."""
    master_bytes = master_rows * row_bytes
    by_size = choose_by_size(
        predicate,
        Size(stream_rows * row_bytes, stream_rows),
        Size(master_bytes, master_rows),
        ClusterFigures(cores, broadcast, sample_above_bytes=0),
    )
    by_counts = choose_by_counts(
        predicate,
        SideCounts(stream_rows, stream_rows),
        SideCounts(master_rows, master_rows),
        row_bytes,
        ClusterFigures(cores, broadcast),
    )
    if by_size is not None:
        assert by_counts is not None and by_counts.scheme == by_size.scheme


def test_the_default_threshold_is_the_documented_16_mib() -> None:
    from pipeline.stage_config import ThetaParams

    assert SAMPLE_ABOVE_BYTES == 16 * MB == ThetaParams().sample_above_bytes
