"""Key samples: histograms scaled to the keyed rows, and candidate ranges that never lose a
matching pair whatever the sample (joins/theta/key_sample.py)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from joins.theta.adsp.plan import Histogram, candidate_columns
from joins.theta.key_sample import KeySample, boundaries, bucket_ranges, histogram
from joins.theta.predicate import ThetaPredicate


def sample_of(values: list[float], k: int, seed: int) -> KeySample:
    """A uniform sample without replacement of the keyed values, as the Spark side draws
    (tests/joins/theta/test_stats.py checks that side against these properties)."""
    present = np.asarray([v for v in values if not math.isnan(v)], dtype=float)
    picked = np.random.default_rng(seed).choice(present, size=min(k, len(present)), replace=False)
    return KeySample(rows=len(values), keyed=len(present), keys=np.sort(picked))


def test_a_whole_sample_gives_exact_bucket_bytes() -> None:
    values = [1.0, 2.0, 2.0, 3.0, 7.0, 9.0, 9.0, 9.0]
    sample = sample_of(values, 100, 0)
    bounds = boundaries(sample, 4)
    hist = histogram(sample, 10.0, bounds)
    exact = Histogram(bounds, (0.0,) * (len(bounds) + 1))
    expected = Counter(exact.bucket(v) for v in values)
    assert hist.bucket_bytes == tuple(10.0 * expected[b] for b in range(len(bounds) + 1))


def test_an_estimated_histogram_scales_to_the_keyed_rows() -> None:
    values = list(np.random.default_rng(3).normal(size=5000))
    sample = sample_of(values, 200, 1)
    hist = histogram(sample, 2.0, boundaries(sample, 8))
    assert len(sample.keys) == 200
    assert math.isclose(sum(hist.bucket_bytes), 2.0 * 5000)


predicates = st.one_of(
    st.builds(
        lambda lower, upper: ThetaPredicate(
            type="band", stream_column="x", master_column="y", lower=lower, upper=upper
        ),
        st.sampled_from([0.0, 0.5, 3.0]),
        st.sampled_from([0.0, 1.0, 40.0]),
    ),
    st.sampled_from(["less", "less_equal", "greater", "greater_equal"]).map(
        lambda kind: ThetaPredicate(type=kind, stream_column="x", master_column="y")
    ),
    st.just(ThetaPredicate(type="range", stream_column="x", lo="lo", hi="hi")),
)


def matches(predicate: ThetaPredicate, s: float, r: float, hi: float) -> bool:
    lower, upper = predicate.band_bounds()
    return {
        "band": s - lower <= r <= s + upper,
        "less": s < r,
        "less_equal": s <= r,
        "greater": s > r,
        "greater_equal": s >= r,
        "range": r <= s < hi,
    }[predicate.type]


@settings(max_examples=150, deadline=None)
@given(
    predicate=predicates,
    stream=st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=40),
    master=st.lists(
        st.tuples(st.floats(-100, 100, allow_nan=False), st.floats(0, 50, allow_nan=False)),
        min_size=1,
        max_size=40,
    ),
    k=st.integers(1, 12),
    buckets=st.integers(2, 8),
)
@example(  # a range row starting at a bucket's upper bound reaches past it
    predicate=ThetaPredicate(type="range", stream_column="x", lo="lo", hi="hi"),
    stream=[10.0, 30.0, 80.0, 90.0],
    master=[(0.0, 0.0), (50.0, 40.0), (100.0, 0.0)],
    k=12,
    buckets=2,
)
@example(  # a band reaches the neighbouring buckets
    predicate=ThetaPredicate(type="band", stream_column="x", master_column="y", eps=6.0),
    stream=[0.0, 10.0, 20.0, 30.0],
    master=[(5.0, 0.0), (15.0, 0.0), (25.0, 0.0), (35.0, 0.0)],
    k=2,
    buckets=4,
)
@example(  # an asymmetric band: master rows reach stream values below them
    predicate=ThetaPredicate(
        type="band", stream_column="x", master_column="y", lower=0.0, upper=40.0
    ),
    stream=[0.0, 45.0, 70.0, 90.0],
    master=[(10.0, 0.0), (60.0, 0.0), (80.0, 0.0)],
    k=12,
    buckets=4,
)
def test_every_matching_pair_lies_in_a_candidate_cell_whatever_was_sampled(
    predicate: ThetaPredicate,
    stream: list[float],
    master: list[tuple[float, float]],
    k: int,
    buckets: int,
) -> None:
    """The invariant that keeps sampled A-DSP exact: the plan covers every result cell."""
    s_sample = sample_of(stream, k, 7)
    r_keys = [r for r, _ in master]
    r_sample = sample_of(r_keys, k, 8)
    widest = max(width for _, width in master) if predicate.type == "range" else 0.0
    r_sample = KeySample(r_sample.rows, r_sample.keyed, r_sample.keys, widest)
    r_bounds = boundaries(r_sample, buckets)
    s_hist = histogram(s_sample, 1.0, boundaries(s_sample, buckets))
    r_hist = histogram(r_sample, 1.0, r_bounds)
    columns = candidate_columns(bucket_ranges(predicate, r_bounds, r_sample.widest), s_hist)
    for s in stream:
        for r, width in master:
            if matches(predicate, s, r, r + width):
                first, last = columns[r_hist.bucket(r)]
                assert first <= s_hist.bucket(s) <= last, (s, r, width)
