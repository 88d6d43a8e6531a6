"""ASketch against exact counts: never under, conservation across the layers, the
count-min bound, the filter's recall of the true top keys on Zipf data, merging parts."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from joins.skew.asketch import ASketch

KEYS = st.one_of(st.integers(-50, 50), st.text(max_size=3))


def zipf_keys(n: int, z: float, domain: int, seed: int) -> list[int]:
    """``n`` keys of ``1..domain`` with P(k) proportional to 1/k^z."""
    weights = 1.0 / np.arange(1, domain + 1) ** z
    rng = np.random.default_rng(seed)
    return [int(k) for k in rng.choice(np.arange(1, domain + 1), n, p=weights / weights.sum())]


def check_invariants(sketch: ASketch, exact: Counter[object]) -> None:
    assert sketch.added == sum(exact.values())
    for key, count in exact.items():
        assert sketch.estimate(key) >= count, key  # 1: never under
    gathered = sum(e.gathered for e in sketch.filter.values())
    for row in sketch.counters:  # 2: conservation, row by row
        assert sum(row) + gathered == sketch.added
    assert len(sketch.filter) <= sketch.phi


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(KEYS, max_size=300),
    phi=st.integers(1, 6),
    width=st.integers(1, 16),
    depth=st.integers(1, 10),
)
def test_never_under_and_every_count_is_kept_somewhere(
    keys: list[object], phi: int, width: int, depth: int
) -> None:
    sketch = ASketch(phi=phi, depth=depth, width=width, seed=7)
    exact: Counter[object] = Counter()
    for key in keys:
        was_hot = key in sketch.filter
        hot = sketch.add(key)
        exact[key] += 1
        # Algorithm 1: hot when it was in the filter, or swapped in from the sketch (its old
        # count is its estimate); a key that took a free slot is not hot yet.
        swapped_in = key in sketch.filter and sketch.filter[key].old > 0
        assert hot == (was_hot or swapped_in)
    check_invariants(sketch, exact)


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(st.lists(KEYS, max_size=80), min_size=1, max_size=4),
    phi=st.integers(1, 5),
    width=st.integers(1, 12),
)
def test_merged_parts_keep_the_invariants_over_the_whole(
    parts: list[list[object]], phi: int, width: int
) -> None:
    sketches = []
    for part in parts:
        sketch = ASketch(phi=phi, depth=3, width=width, seed=1)
        sketch.add_all(part)
        sketches.append(sketch)
    merged = sketches[0]
    for sketch in sketches[1:]:
        merged = merged.merge(sketch)
    check_invariants(merged, Counter(k for part in parts for k in part))
    # The saved form round-trips exactly.
    again = ASketch.from_dict(json.loads(json.dumps(merged.to_dict())))
    assert again.to_dict() == merged.to_dict()
    assert again.counters == merged.counters
    # All parts at once: the same counters, and a filter of the keys estimated highest.
    at_once = ASketch.merge_all(sketches)
    check_invariants(at_once, Counter(k for part in parts for k in part))
    if len(sketches) > 1:  # (one part alone is not merged: its filter's gathering stays)
        assert at_once.counters == merged.counters
    candidates = {k for sketch in sketches for k in sketch.filter}
    kept = sorted((at_once.estimate(k) for k in at_once.filter), reverse=True)
    left_out = [at_once.estimate(k) for k in candidates - set(at_once.filter)]
    assert len(at_once.filter) == min(phi, len(candidates))
    assert not left_out or not kept or max(left_out) <= kept[-1]


def test_the_count_min_bound_holds_for_nearly_every_key() -> None:
    stream = zipf_keys(50_000, 1.0, 20_000, seed=3)
    sketch = ASketch.for_error(epsilon=0.002, delta=0.01, phi=32)
    sketch.add_all(stream)
    exact = Counter(stream)
    bound = 0.002 * len(stream)
    errors = [sketch.estimate(k) - c for k, c in exact.items()]
    within = sum(e <= bound for e in errors) / len(errors)
    assert within >= 0.99, within  # the bound holds with probability 1 - delta per key
    assert min(errors) >= 0


@pytest.mark.parametrize(("z", "recall"), [(1.0, 0.9), (1.5, 1.0), (2.0, 1.0)])
def test_the_filter_holds_the_true_top_keys_of_a_zipf_stream(z: float, recall: float) -> None:
    stream = zipf_keys(100_000, z, 50_000, seed=11)
    sketch = ASketch(phi=32, depth=4, width=2048)  # the paper's setting: top-32, 16 KB+
    sketch.add_all(stream)
    top = {k for k, _ in Counter(stream).most_common(16)}
    found = top & set(sketch.filter)
    assert len(found) / len(top) >= recall, sorted(top - found)
    # The filter's estimates of its keys are near exact for the hot keys.
    exact = Counter(stream)
    for key, estimate in sketch.hot_keys()[:8]:
        assert exact[key] <= estimate <= exact[key] * 1.05 + 10


def test_a_sketch_is_far_smaller_than_exact_counts_of_a_large_domain() -> None:
    random.seed(5)
    stream = [random.randrange(1_000_000) for _ in range(200_000)]
    sketch = ASketch(phi=32, depth=4, width=1024)
    sketch.add_all(stream)
    assert sketch.size_bytes() < 40_000 < 8 * len(set(stream))


def test_bad_shapes_and_saved_forms_are_refused() -> None:
    with pytest.raises(ValueError, match="phi, depth and width >= 1"):
        ASketch(phi=0)
    with pytest.raises(ValueError, match="same phi, depth, width and seed"):
        ASketch(seed=1).merge(ASketch(seed=2))
    with pytest.raises(ValueError, match="not a saved sketch"):
        ASketch.from_dict({"phi": 2})
    saved = ASketch(phi=2, depth=2, width=4).to_dict()
    with pytest.raises(ValueError, match=r"cell \(2, 0\) is outside"):
        ASketch.from_dict(saved | {"cells": [[2, 0, 5]]})
    with pytest.raises(ValueError, match="at least one sketch"):
        ASketch.merge_all([])
    with pytest.raises(ValueError, match="count >= 1"):
        ASketch().add("k", 0)
