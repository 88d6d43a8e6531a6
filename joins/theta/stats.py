"""Statistics for theta planning on Spark: exact counts and a uniform key sample per side.

Each side's ordering key (as a number, :func:`joins.theta.adsp.join.numeric`) and, for a range
predicate, the master's interval width are read by two JVM jobs for all sides together
(:func:`key_samples`): a count, then a Bernoulli sample sized from it. Where the optimizer
knows every side's rows exactly (a materialized cache), one job draws and counts at once
(:func:`observed_samples`). The driver derives
histograms and candidate ranges from the samples (:mod:`joins.theta.key_sample`). Four passes
(quantiles and bucket counts per side) became two for both sides, with no Python worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from joins.theta.adsp.join import key_spec, numeric
from joins.theta.adsp.plan import Histogram, ThetaPlan, ValueRange, plan_theta
from joins.theta.key_sample import KeySample, SideCounts, boundaries, bucket_ranges, histogram
from joins.theta.predicate import ThetaPredicate
from warehouse.spark import plan_size

DEFAULT_SAMPLE_SIZE = 10_000
DEFAULT_BUCKETS = 32


@dataclass(frozen=True)
class MasterStatistics:
    """The master's histogram and, per bucket, the stream values that can match it."""

    histogram: Histogram
    ranges: tuple[ValueRange | None, ...]


def master_statistics_of(
    sample: KeySample, predicate: ThetaPredicate, row_bytes: float, buckets: int
) -> MasterStatistics:
    bounds = boundaries(sample, buckets)
    return MasterStatistics(
        histogram(sample, row_bytes, bounds), bucket_ranges(predicate, bounds, sample.widest)
    )


def stream_histogram_of(
    sample: KeySample,
    row_bytes: float,
    buckets: int,
    bounds: Sequence[float] | None = None,
) -> Histogram:
    return histogram(sample, row_bytes, boundaries(sample, buckets) if bounds is None else bounds)


# A Bernoulli draw aims at t keys with t - Z sqrt(t) = k: it falls short of k only when it
# lands Z standard deviations (at most sqrt(t)) below its mean, about 3e-7 of draws.
SHORTFALL_Z = 5.0


def draw_target(k: int) -> float:
    """Expected keys to draw so that at least ``k`` arrive: 10,512 for k = 10,000."""
    return ((SHORTFALL_Z + math.sqrt(SHORTFALL_Z**2 + 4 * k)) / 2) ** 2


Side = tuple[DataFrame, Column, Column | None]


def key_samples(
    sides: Sequence[Side],
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
    known_rows: Sequence[int | None] | None = None,
) -> list[KeySample]:
    """A uniform sample of each side's keys, with exact counts: two JVM jobs for all sides,
    or one when ``known_rows`` holds every side's row count (:func:`observed_samples`).

    ``sides``: (frame, numeric key, numeric interval width or None) per side.

    1. :func:`side_counts`: one aggregation counts each side's rows and keyed rows (and
       the widest range).
    2. :func:`draw_samples`: one scan keeps each keyed row with probability
       ``p_i = min(1, t / keyed_i)`` (``rand(seed) < p_i``; :func:`draw_target` gives
       ``t``), all sides in one union; the driver keeps ``k`` of a side's drawn keys,
       uniformly without replacement.

    A Bernoulli sample, given its size, is a uniform sample without replacement, and so is
    a uniform subsample of it: the result is uniform over the side whatever the
    partitioning. A draw that falls short of ``k`` keeps what it drew (a smaller uniform
    sample). Measured on two cached 1M-row sides (BENCHMARKS.md, session 13): the Python
    ``mapInArrow`` bottom-k sampler took 1.1-1.4 s, a ``TakeOrderedAndProject`` bottom-k
    per side with ``observe`` counts 0.7 s, these two jobs 0.43-0.56 s.
    """
    _check_sample_size(sample_size)  # before the counting job, not after it
    if known_rows is not None and all(rows is not None for rows in known_rows):
        return observed_samples(sides, [int(rows or 0) for rows in known_rows], sample_size, seed)
    return draw_samples(sides, side_counts(sides), sample_size, seed)


def _check_sample_size(sample_size: int) -> None:
    if sample_size < 1:
        raise ValueError(f"a key sample needs room for at least 1 key, got k = {sample_size}")


def _keys(sides: Sequence[Side], observations: Sequence[Observation] | None = None) -> DataFrame:
    """Every side's numeric key (and width) in one union, tagged with the side's index;
    with ``observations``, each side's counts are observed as its rows pass
    (:func:`observed_samples`)."""
    parts = []
    for index, (frame, key, width) in enumerate(sides):
        part = frame.select(
            F.lit(index).alias("side"),
            key.cast("double").alias("key"),
            (width if width is not None else F.lit(None)).cast("double").alias("width"),
        )
        if observations is not None:
            # Per side, so no aggregate tests the side: 0.20 s against 0.25-0.30 s for the
            # side-conditional counts over the union, at 2 x 1M cached rows.
            part = part.observe(
                observations[index],
                F.count(F.lit(1)).alias("rows"),
                F.count(F.when(_keyed(), 1)).alias("keyed"),
                F.max(F.when(~F.isnan("width"), F.col("width"))).alias("widest"),
            )
        parts.append(part)
    return reduce(DataFrame.unionByName, parts)


def _keyed() -> Column:
    """The row's key is a number (not null, not NaN): only those rows can match."""
    return F.col("key").isNotNull() & ~F.isnan("key")


def _count_columns(sides: int) -> list[Column]:
    """Per side: rows, keyed rows and the widest range, as global aggregates."""
    aggregates = []
    for index in range(sides):
        on_side = F.col("side") == index
        aggregates += [
            F.count(F.when(on_side, 1)).alias(f"rows_{index}"),
            F.count(F.when(on_side & _keyed(), 1)).alias(f"keyed_{index}"),
            F.max(F.when(on_side & ~F.isnan("width"), F.col("width"))).alias(f"widest_{index}"),
        ]
    return aggregates


def side_counts(sides: Sequence[Side]) -> list[SideCounts]:
    """Each side's rows, keyed rows and widest range: one job for all sides."""
    # One global aggregate (per-side conditional counts): a groupBy would shuffle into
    # spark.sql.shuffle.partitions tasks, nearly all of them empty.
    totals = _keys(sides).agg(*_count_columns(len(sides))).collect()[0].asDict()
    return _counts_of(totals, len(sides))


def _counts_of(totals: Mapping[str, Any], sides: int) -> list[SideCounts]:
    return [
        _side_counts_of({name: totals[f"{name}_{index}"] for name in ("rows", "keyed", "widest")})
        for index in range(sides)
    ]


def _side_counts_of(totals: Mapping[str, Any]) -> SideCounts:
    """One side's ``rows``, ``keyed`` and ``widest`` (null, or not above 0: no range)."""
    widest = totals["widest"]
    return SideCounts(
        rows=int(totals["rows"]),
        keyed=int(totals["keyed"]),
        widest=float(widest) if widest is not None and widest > 0 else 0.0,
    )


def draw_samples(
    sides: Sequence[Side],
    counts: Sequence[SideCounts],
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
) -> list[KeySample]:
    """Up to ``sample_size`` uniform keys per side, given the sides' exact ``counts``."""
    _check_sample_size(sample_size)
    drawn = _draw(_keys(sides), [c.keyed for c in counts], sample_size, seed)
    return _subsampled(drawn, counts, sample_size, seed)


def observed_samples(
    sides: Sequence[Side],
    known_rows: Sequence[int],
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
) -> list[KeySample]:
    """Like :func:`key_samples`, in one job: the draw is sized from ``known_rows`` (the
    optimizer's exact count of a materialized cache, :func:`warehouse.spark.plan_size`)
    and the exact counts are observed (``DataFrame.observe``) by the same scan.

    Every row passes the observation before the draw's filter, so the counts are exact
    whatever ``known_rows`` says; a wrong figure only sizes the draw. Rows are an upper
    bound of keyed rows, so a side with null or NaN keys draws fewer than ``k`` in
    proportion (a smaller uniform sample). Measured on two cached 1M-row sides: 0.18-0.22 s
    against 0.5-0.55 s for the count and the draw (session 16, BENCHMARKS.md).
    """
    _check_sample_size(sample_size)
    observations = [Observation() for _ in sides]
    drawn = _draw(_keys(sides, observations), known_rows, sample_size, seed)
    counts = [_side_counts_of(observation.get) for observation in observations]
    return _subsampled(drawn, counts, sample_size, seed)


def _draw(keys: DataFrame, sizes: Sequence[int], sample_size: int, seed: int) -> pa.Table:
    """Keep each keyed row of side ``i`` with probability ``min(1, t / sizes[i])``."""
    fractions = [min(1.0, draw_target(sample_size) / n) if n else 0.0 for n in sizes]
    chance = F.element_at(F.array(*[F.lit(f) for f in fractions]), F.col("side") + 1)
    return keys.where(_keyed() & (F.rand(seed) < chance)).select("side", "key").toArrow()


def _subsampled(
    drawn: pa.Table, counts: Sequence[SideCounts], sample_size: int, seed: int
) -> list[KeySample]:
    """At most ``sample_size`` of each side's drawn keys, uniformly without replacement."""
    side = drawn.column("side").to_numpy()
    keys = drawn.column("key").to_numpy(zero_copy_only=False).astype(float)
    rng = np.random.default_rng(seed)
    samples = []
    for index, count in enumerate(counts):
        mine = keys[side == index]
        if len(mine) > sample_size:
            mine = rng.choice(mine, size=sample_size, replace=False)
        samples.append(KeySample(count.rows, count.keyed, np.sort(mine), count.widest))
    return samples


def stream_key(stream: DataFrame, predicate: ThetaPredicate) -> Column:
    keys = key_spec(predicate)
    return numeric(F.col(keys.stream_key), stream.schema[keys.stream_key].dataType)


def master_key(master: DataFrame, predicate: ThetaPredicate) -> tuple[Column, Column | None]:
    """The master's ordering key and, for a range predicate, its interval width."""
    keys = key_spec(predicate)
    key = numeric(F.col(keys.master_key), master.schema[keys.master_key].dataType)
    if keys.master_high is None:
        return key, None
    high = numeric(F.col(keys.master_high), master.schema[keys.master_high].dataType)
    return key, high - key


def stream_sample(
    stream: DataFrame, predicate: ThetaPredicate, sample_size: int = DEFAULT_SAMPLE_SIZE
) -> KeySample:
    """The stream's key sample alone (a counting job, then a draw; one job if its rows
    are known)."""
    side = (stream, stream_key(stream, predicate), None)
    (sample,) = key_samples([side], sample_size, known_rows=[plan_size(stream).rows])
    return sample


def master_sample(
    master: DataFrame, predicate: ThetaPredicate, sample_size: int = DEFAULT_SAMPLE_SIZE
) -> KeySample:
    """The master's key sample alone (two jobs, or one if its rows are known), with the
    widest interval for ranges."""
    key, width = master_key(master, predicate)
    (sample,) = key_samples(
        [(master, key, width)], sample_size, known_rows=[plan_size(master).rows]
    )
    return sample


def theta_sides(stream: DataFrame, master: DataFrame, predicate: ThetaPredicate) -> list[Side]:
    """The (stream, master) sides whose keys a theta join's statistics read."""
    key, width = master_key(master, predicate)
    return [(stream, stream_key(stream, predicate), None), (master, key, width)]


def theta_samples(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
) -> tuple[KeySample, KeySample]:
    """Both sides' key samples: (stream, master)."""
    known = [plan_size(stream).rows, plan_size(master).rows]
    sides = theta_sides(stream, master, predicate)
    stream_sample, master_sample = key_samples(sides, sample_size, known_rows=known)
    return stream_sample, master_sample


def plan_from_samples(
    stream: KeySample,
    master: KeySample,
    predicate: ThetaPredicate,
    task_memory: float,
    scheme: str,
    stream_row_bytes: float,
    master_row_bytes: float,
    buckets: int = DEFAULT_BUCKETS,
) -> ThetaPlan:
    stats = master_statistics_of(master, predicate, master_row_bytes, buckets)
    stream_hist = stream_histogram_of(stream, stream_row_bytes, buckets)
    return plan_theta(stats.histogram, stream_hist, stats.ranges, task_memory, scheme)


def theta_plan(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    task_memory: float,
    scheme: str,
    stream_row_bytes: float,
    master_row_bytes: float,
    buckets: int = DEFAULT_BUCKETS,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
) -> ThetaPlan:
    stream_sample, master_sample = theta_samples(stream, master, predicate, sample_size)
    return plan_from_samples(
        stream_sample,
        master_sample,
        predicate,
        task_memory,
        scheme,
        stream_row_bytes,
        master_row_bytes,
        buckets,
    )
