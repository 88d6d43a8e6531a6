"""Key samples drawn by Spark (joins/theta_stats.py): exact counts, a sub-multiset of the
keys, the whole side below k, the widest range, and uniformity across uneven partitions."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.theta_stats import key_samples

SCHEMA = T.StructType(
    [T.StructField("key", T.DoubleType(), True), T.StructField("width", T.DoubleType(), True)]
)
keys = st.lists(
    st.one_of(st.floats(-1e3, 1e3, allow_nan=False), st.just(math.nan), st.none()),
    max_size=60,
)


@settings(max_examples=15, deadline=None)
@given(values=keys, k=st.integers(1, 30), partitions=st.integers(1, 3), seed=st.integers(0, 99))
def test_a_sample_counts_every_row_and_draws_from_the_keys(
    spark: SparkSession, values: list[float | None], k: int, partitions: int, seed: int
) -> None:
    rows = [(v, None if v is None else abs(v) / 2) for v in values]
    frame = spark.createDataFrame(rows, SCHEMA).repartition(partitions)
    (sample,) = key_samples([(frame, F.col("key"), F.col("width"))], k, seed)
    present = [v for v in values if v is not None and not math.isnan(v)]
    assert sample.rows == len(values)
    assert sample.keyed == len(present)
    assert len(sample.keys) == min(k, len(present))
    assert not Counter(sample.keys.tolist()) - Counter(present)  # a sub-multiset
    assert list(sample.keys) == sorted(sample.keys)
    if len(present) <= k:
        assert sample.exact and sorted(sample.keys.tolist()) == sorted(present)
    widths = [abs(v) / 2 for v in present]
    assert sample.widest == pytest.approx(max((w for w in widths if w > 0), default=0.0))


def test_a_sample_is_uniform_across_uneven_partitions(spark: SparkSession) -> None:
    """400 keys, 320 in one partition and 80 in the other: a 10-key sample holds each key
    with probability 1/40, so the small partition gives 1/5 of all draws. Taking the first
    k rows, or k per partition, would not."""
    frame = (
        spark.createDataFrame([(float(v), None) for v in range(400)], SCHEMA)
        .repartitionByRange(2, F.when(F.col("key") < 320, 0).otherwise(1))
        .cache()
    )
    assert sorted(len(p) for p in frame.rdd.glom().collect()) == [80, 320]
    trials, small = 40, 0
    for seed in range(trials):
        (sample,) = key_samples([(frame, F.col("key"), None)], 10, seed)
        assert len(sample.keys) == 10
        small += int((sample.keys >= 320).sum())
    frame.unpersist()
    # 400 draws, 80 expected from the small partition (sd about 8)
    assert abs(small - 80) < 35, small


def test_a_sample_without_room_for_a_key_is_refused(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1.0, None)], SCHEMA)
    with pytest.raises(ValueError, match="at least 1 key, got k = 0"):
        key_samples([(frame, F.col("key"), None)], 0)
