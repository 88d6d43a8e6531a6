"""Theta statistics from one uniform key sample per side (bottom-k sampling).

A-DSP plans from equi-depth histograms of both sides' ordering keys (Sec. 3.1 of the
A-DSP paper). Computing them exactly took four Spark passes (two ``approxQuantile`` and two
bucket counts), about half of a 1M x 1M join. Here each side is read once: every row
with a key draws a uniform tag, each partition keeps the ``k`` rows with the smallest tags
(:class:`BottomK`), and the driver keeps the ``k`` smallest of those (:func:`merge`). The
``k`` smallest tags of the union are a uniform sample without replacement of all keyed rows,
whatever the partitioning, so per-partition sampling loses nothing.

What the sample decides and what it may not:

- **Boundaries and bucket sizes** are estimates (quantiles of the sample; bucket rows
  scaled from sampled counts). They shape the plan only: a poor estimate costs balance, not
  rows. Below ``k`` keyed rows the sample is the whole side and both are exact.
- **Candidate ranges are never estimated.** Master bucket ``j`` holds keys in
  ``(b_{j-1}, b_j]`` whatever was sampled, so the stream values that can match it are
  derived from those bounds (open-ended for the outer buckets) and, for range predicates,
  the exact widest interval ``max(hi - lo)``. Every matching pair therefore lies in a
  candidate cell (:func:`bucket_ranges`), which is what keeps A-DSP exact.

Bucket rule, as in :mod:`joins.adsp_plan`: ``bucket(v) = #{k : b_k < v}``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from joins.adsp_plan import Histogram, ValueRange
from joins.theta_predicate import ThetaPredicate


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
    def exact(self) -> bool:
        """True when the sample holds every keyed row."""
        return len(self.keys) == self.keyed


class BottomK:
    """The ``k`` rows with the smallest tags seen so far, plus exact counts (one partition)."""

    def __init__(self, k: int, rng: np.random.Generator) -> None:
        if k < 1:
            raise ValueError(f"a key sample needs room for at least 1 key, got k = {k}")
        self.k = k
        self.rng = rng
        self.rows = 0
        self.keyed = 0
        self.widest = -math.inf
        self.tags = np.empty(0)
        self.keys = np.empty(0)

    def add(self, keys: np.ndarray, widths: np.ndarray | None = None) -> None:
        """Offer a batch of keys (NaN for a missing key) and, for ranges, their widths."""
        self.rows += len(keys)
        if widths is not None and len(widths):
            finite = widths[~np.isnan(widths)]
            if len(finite):
                self.widest = max(self.widest, float(finite.max()))
        present = keys[~np.isnan(keys)]
        self.keyed += len(present)
        tags = self.rng.random(len(present))
        self.tags = np.concatenate([self.tags, tags])
        self.keys = np.concatenate([self.keys, present])
        if len(self.tags) > self.k:
            keep = np.argpartition(self.tags, self.k - 1)[: self.k]
            self.tags, self.keys = self.tags[keep], self.keys[keep]


@dataclass(frozen=True)
class PartialSample:
    """What one partition sends to the driver for one side."""

    rows: int
    keyed: int
    widest: float
    tags: np.ndarray = field(repr=False)
    keys: np.ndarray = field(repr=False)

    @classmethod
    def of(cls, part: BottomK) -> PartialSample:
        return cls(part.rows, part.keyed, part.widest, part.tags, part.keys)


def merge(parts: Iterable[PartialSample], k: int) -> KeySample:
    """The ``k`` smallest tags over all partitions: a uniform sample of the whole side."""
    parts = list(parts)
    tags = np.concatenate([p.tags for p in parts]) if parts else np.empty(0)
    keys = np.concatenate([p.keys for p in parts]) if parts else np.empty(0)
    if len(tags) > k:
        keep = np.argpartition(tags, k - 1)[:k]
        keys = keys[keep]
    widest = max((p.widest for p in parts), default=-math.inf)
    return KeySample(
        rows=sum(p.rows for p in parts),
        keyed=sum(p.keyed for p in parts),
        keys=np.sort(keys),
        widest=widest if widest > 0 else 0.0,
    )


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
