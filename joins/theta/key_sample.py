"""Theta statistics from exact counts and one uniform key sample per side.

A-DSP plans from equi-depth histograms of both sides' ordering keys (Sec. 3.1 of the
A-DSP paper). Computing them exactly took four Spark passes (two ``approxQuantile`` and two
bucket counts), about half of a 1M x 1M join. Here each side gets exact row counts and a
uniform sample without replacement of ``k`` keys (:func:`joins.theta.stats.key_samples`
draws both in the JVM).

What the sample decides and what it may not:

- **Boundaries and bucket sizes** are estimates (quantiles of the sample; bucket rows
  scaled from sampled counts). They shape the plan only: a poor estimate costs balance, not
  rows. Below ``k`` keyed rows the sample is the whole side and both are exact.
- **Candidate ranges are never estimated.** Master bucket ``j`` holds keys in
  ``(b_{j-1}, b_j]`` whatever was sampled, so the stream values that can match it are
  derived from those bounds (open-ended for the outer buckets) and, for range predicates,
  the exact widest interval ``max(hi - lo)``. Every matching pair therefore lies in a
  candidate cell (:func:`bucket_ranges`), which is what keeps A-DSP exact.

Bucket rule, as in :mod:`joins.theta.adsp.plan`: ``bucket(v) = #{k : b_k < v}``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from joins.theta.adsp.plan import Histogram, ValueRange
from joins.theta.predicate import ThetaPredicate


@dataclass(frozen=True)
class SideCounts:
    """One side's exact row count, rows whose key is a number, and ``max(hi - lo)`` for a
    range predicate's master (else 0): all ``auto`` needs to decide a broadcast."""

    rows: int
    keyed: int
    widest: float = 0.0


@dataclass(frozen=True)
class KeySample:
    """One side's row count and a uniform sample of its non-null, non-NaN keys.

    ``keyed`` counts the rows whose key is a number; rows without one can never match and
    are never routed. ``widest`` is ``max(hi - lo)`` for a range predicate's master, else 0.
    """

    rows: int
    keyed: int
    keys: np.ndarray = field(repr=False)
    widest: float = 0.0

    @property
    def counts(self) -> SideCounts:
        return SideCounts(self.rows, self.keyed, self.widest)

    @property
    def exact(self) -> bool:
        """True when the sample holds every keyed row."""
        return len(self.keys) == self.keyed


def boundaries(sample: KeySample, buckets: int) -> tuple[float, ...]:
    """Inner equi-depth boundaries: the sample's ``i / buckets`` quantiles, distinct."""
    if len(sample.keys) == 0 or buckets < 2:
        return ()
    keys = np.sort(sample.keys)
    picks = [keys[min(len(keys) - 1, (i * len(keys)) // buckets)] for i in range(1, buckets)]
    # The largest key as a boundary would leave the last bucket empty by construction.
    return tuple(sorted({float(v) for v in picks if v < keys[-1]}))


def histogram(sample: KeySample, row_bytes: float, bounds: Sequence[float]) -> Histogram:
    """Bytes per bucket over ``bounds``: sampled counts scaled to the keyed rows."""
    edges = np.asarray(bounds, dtype=float)
    counts = np.bincount(
        np.searchsorted(edges, sample.keys, side="left"), minlength=len(edges) + 1
    ).astype(float)
    scale = sample.keyed / len(sample.keys) if len(sample.keys) else 0.0
    return Histogram(tuple(float(b) for b in bounds), tuple(counts * scale * row_bytes))


def candidate_range(predicate: ThetaPredicate, low: float, high: float, top: float) -> ValueRange:
    """Stream values that can match master keys in ``[low, high]`` (``top``: largest ``hi``)."""
    lower, upper = predicate.band_bounds()
    kind = predicate.type
    if kind == "band":  # s - lower <= r <= s + upper
        return ValueRange(low - upper, high + lower)
    if kind in ("less", "less_equal"):  # s < r
        return ValueRange(-math.inf, high)
    if kind in ("greater", "greater_equal"):  # s > r
        return ValueRange(low, math.inf)
    return ValueRange(low, top)  # range: lo <= s < hi


def bucket_ranges(
    predicate: ThetaPredicate, bounds: Sequence[float], widest: float
) -> tuple[ValueRange, ...]:
    """Candidate stream values of each master bucket, from its bounds alone (exact).

    Bucket ``j`` holds keys in ``(b_{j-1}, b_j]`` (unbounded at the ends); for a range
    predicate its rows' ``hi`` is at most ``b_j + widest``.
    """
    edges = [-math.inf, *bounds, math.inf]
    return tuple(
        candidate_range(predicate, edges[j], edges[j + 1], edges[j + 1] + widest)
        for j in range(len(edges) - 1)
    )
