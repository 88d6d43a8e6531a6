"""Key samples drawn by Spark (joins/theta/stats.py): exact counts, a sub-multiset of the
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

from joins.theta.stats import key_samples

SCHEMA = T.StructType(
    [T.StructField("key", T.DoubleType(), True), T.StructField("width", T.DoubleType(), True)]
)
keys = st.lists(
    st.one_of(st.floats(-1e3, 1e3, allow_nan=False), st.just(math.nan), st.none()),
    max_size=60,
)


@settings(max_examples=20, deadline=None)
@given(
    values=keys,
    k=st.integers(1, 30),
    partitions=st.integers(1, 3),
    seed=st.integers(0, 99),
    known=st.sampled_from(["counted", "exact", "wrong"]),
)
def test_a_sample_counts_every_row_and_draws_from_the_keys(
    spark: SparkSession,
    values: list[float | None],
    k: int,
    partitions: int,
    seed: int,
    known: str,
) -> None:
    """Counted first (two jobs) or with the rows known (one job, counts observed): the
    counts are exact either way, even when the known figure is wrong (it sizes the draw)."""
    rows = [(v, None if v is None else abs(v) / 2) for v in values]
    frame = spark.createDataFrame(rows, SCHEMA).repartition(partitions)
    known_rows = {"counted": None, "exact": [len(values)], "wrong": [3 * len(values) + 7]}[known]
    (sample,) = key_samples([(frame, F.col("key"), F.col("width"))], k, seed, known_rows)
    present = [v for v in values if v is not None and not math.isnan(v)]
    assert sample.rows == len(values)
    assert sample.keyed == len(present)
    if known == "counted" or (known == "exact" and len(present) == len(values)):
        assert len(sample.keys) == min(k, len(present))
    else:  # sized from more rows than keys: a smaller uniform sample
        assert len(sample.keys) <= min(k, len(present))
    assert not Counter(sample.keys.tolist()) - Counter(present)  # a sub-multiset
    assert list(sample.keys) == sorted(sample.keys)
    if len(present) <= k and len(sample.keys) == len(present):
        assert sample.exact and sorted(sample.keys.tolist()) == sorted(present)
    widths = [abs(v) / 2 for v in present]
    assert sample.widest == pytest.approx(max((w for w in widths if w > 0), default=0.0))


@pytest.mark.parametrize("known_rows", [None, [400]])
def test_a_sample_is_uniform_across_uneven_partitions(
    spark: SparkSession, known_rows: list[int | None] | None
) -> None:
    """400 keys, 320 in one partition and 80 in the other: a 40-key sample holds each key
    with probability 1/10, so the small partition gives 1/5 of all draws. Taking the first
    k rows (none, or all, from it), or k/2 per partition (1/2), would not."""
    frame = (
        spark.createDataFrame([(float(v), None) for v in range(400)], SCHEMA)
        .repartitionByRange(2, F.when(F.col("key") < 320, 0).otherwise(1))
        .cache()
    )
    assert sorted(len(p) for p in frame.rdd.glom().collect()) == [80, 320]
    trials, small = 10, 0  # 10 sampling jobs (40 of 10-key samples: the same spread)
    for seed in range(trials):
        (sample,) = key_samples([(frame, F.col("key"), None)], 40, seed, known_rows)
        assert len(sample.keys) == 40
        small += int((sample.keys >= 320).sum())
    frame.unpersist()
    # 400 draws, 80 expected from the small partition (sd about 8)
    assert abs(small - 80) < 35, small


def test_a_sample_without_room_for_a_key_is_refused(spark: SparkSession) -> None:
    frame = spark.createDataFrame([(1.0, None)], SCHEMA)
    with pytest.raises(ValueError, match="at least 1 key, got k = 0"):
        key_samples([(frame, F.col("key"), None)], 0)


def test_known_row_counts_save_the_counting_job(spark: SparkSession) -> None:
    """Counted first: a counting job (with AQE its aggregate may run as two), then the draw.
    Rows known: the draw alone, counting as it goes."""
    big = spark.createDataFrame([(float(v), None) for v in range(500)], SCHEMA)
    small = spark.createDataFrame([(float(v), 1.0) for v in range(40)], SCHEMA)
    sides = [(big, F.col("key"), None), (small, F.col("key"), F.col("width"))]
    tracker = spark.sparkContext.statusTracker()
    jobs = {}
    for label, known_rows in (("counted", None), ("known", [500, 40])):
        group = f"key-samples-{label}"
        spark.sparkContext.setJobGroup(group, "count the jobs")
        try:
            first, second = key_samples(sides, 20, 3, known_rows)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        jobs[label] = len(tracker.getJobIdsForGroup(group))
        assert (first.rows, first.keyed, len(first.keys)) == (500, 500, 20)
        assert (second.rows, second.keyed, len(second.keys), second.widest) == (40, 40, 20, 1.0)
    assert jobs["known"] == 1 and jobs["counted"] >= 2, jobs
