"""Statistics for theta planning: equi-depth histograms of both sides' ordering keys.

Boundaries come from ``approxQuantile``; per-bucket row counts and key ranges from one
aggregation per side. Bytes per bucket are row counts times measured bytes per row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from joins.adsp import bucket_of, key_spec, numeric
from joins.adsp_plan import Histogram, ThetaPlan, ValueRange, plan_theta
from joins.theta_predicate import ThetaPredicate


def _boundaries(frame: DataFrame, key: str, buckets: int) -> tuple[float, ...]:
    probabilities = [i / buckets for i in range(1, buckets)]
    values = frame.where(F.col(key).isNotNull()).approxQuantile(key, probabilities, 0.001)
    return tuple(sorted(set(values)))


def candidate_range(predicate: ThetaPredicate, low: float, high: float, top: float) -> ValueRange:
    """Stream values that can match master keys in [low, high] (``top``: max of range hi)."""
    lower, upper = predicate.band_bounds()
    kind = predicate.type
    if kind == "band":
        return ValueRange(low - upper, high + lower)
    if kind in ("less", "less_equal"):
        return ValueRange(-math.inf, high)
    if kind in ("greater", "greater_equal"):
        return ValueRange(low, math.inf)
    return ValueRange(low, top)  # range: lo <= s < hi


@dataclass(frozen=True)
class MasterStatistics:
    """The master's histogram and, per bucket, the stream values that can match it."""

    histogram: Histogram
    ranges: tuple[ValueRange | None, ...]


def master_statistics(
    master: DataFrame,
    predicate: ThetaPredicate,
    master_row_bytes: float,
    buckets: int = 32,
) -> MasterStatistics:
    keys = key_spec(predicate)
    r_type = master.schema[keys.master_key].dataType
    r_cols = [numeric(F.col(keys.master_key), r_type).alias("k")]
    if keys.master_high:
        r_cols.append(
            numeric(F.col(keys.master_high), master.schema[keys.master_high].dataType).alias("h")
        )
    else:
        r_cols.append(F.lit(None).cast("double").alias("h"))
    r_key = master.select(*r_cols)
    r_bounds = _boundaries(r_key, "k", buckets)
    r_hist_stub = Histogram(r_bounds, (0.0,) * (len(r_bounds) + 1))
    r_rows = (
        r_key.groupBy(bucket_of(F.col("k"), r_hist_stub).alias("b"))
        .agg(F.count(F.lit(1)), F.min("k"), F.max("k"), F.max("h"))
        .collect()
    )
    r_stats = {row[0]: row for row in r_rows if row[0] is not None}
    histogram = Histogram(
        r_bounds,
        tuple(
            (r_stats[b][1] if b in r_stats else 0) * master_row_bytes
            for b in range(len(r_bounds) + 1)
        ),
    )
    ranges: list[ValueRange | None] = []
    for b in range(len(r_bounds) + 1):
        row = r_stats.get(b)
        if row is None:
            ranges.append(None)
            continue
        top = row[4] if row[4] is not None else row[3]
        ranges.append(candidate_range(predicate, row[2], row[3], top))
    return MasterStatistics(histogram, tuple(ranges))


def stream_histogram(
    stream: DataFrame,
    predicate: ThetaPredicate,
    stream_row_bytes: float,
    buckets: int = 32,
    boundaries: tuple[float, ...] | None = None,
) -> Histogram:
    """Equi-depth histogram of the stream keys; over given ``boundaries`` if passed."""
    keys = key_spec(predicate)
    s_key = stream.select(
        numeric(F.col(keys.stream_key), stream.schema[keys.stream_key].dataType).alias("k")
    )
    s_bounds = boundaries if boundaries is not None else _boundaries(s_key, "k", buckets)
    s_counts = {
        row[0]: row[1]
        for row in s_key.groupBy(
            bucket_of(F.col("k"), Histogram(s_bounds, (0.0,) * (len(s_bounds) + 1))).alias("b")
        )
        .count()
        .collect()
        if row[0] is not None
    }
    return Histogram(
        s_bounds, tuple(s_counts.get(b, 0) * stream_row_bytes for b in range(len(s_bounds) + 1))
    )


def theta_plan(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    task_memory: float,
    scheme: str,
    stream_row_bytes: float,
    master_row_bytes: float,
    buckets: int = 32,
) -> ThetaPlan:
    stats = master_statistics(master, predicate, master_row_bytes, buckets)
    stream_hist = stream_histogram(stream, predicate, stream_row_bytes, buckets)
    return plan_theta(stats.histogram, stream_hist, stats.ranges, task_memory, scheme)
