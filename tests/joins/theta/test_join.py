"""A-DSP, Square and Dynamic theta joins equal DuckDB's join over the same inputs."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.theta.adsp.join import adsp_join, bucket_of
from joins.theta.adsp.plan import Histogram, route_master_line, route_stream_line
from joins.theta.join import (
    FixedRowBytes,
    RowBytes,
    Samples,
    resolve_scheme,
    scheme_join_flagged,
)
from joins.theta.predicate import ThetaPredicate
from joins.theta.stats import theta_plan
from tests.helpers import assert_same_multiset

ROW_BYTES = FixedRowBytes(stream_bytes=16.0, master_bytes=32.0)
STREAM = T.StructType([T.StructField("sid", T.LongType()), T.StructField("x", T.DoubleType())])
MASTER = T.StructType(
    [
        T.StructField("rid", T.LongType()),
        T.StructField("y", T.DoubleType()),
        T.StructField("lo", T.DoubleType()),
        T.StructField("hi", T.DoubleType()),
    ]
)
ORACLE = {
    "band": "m.y BETWEEN s.x - {lower} AND s.x + {upper}",
    "range": "m.lo <= s.x AND s.x < m.hi",
    "less": "s.x < m.y",
    "less_equal": "s.x <= m.y",
    "greater": "s.x > m.y",
    "greater_equal": "s.x >= m.y",
}


def duckdb_pairs(
    stream: list[tuple], master: list[tuple], condition: str, how: str = ""
) -> list[tuple]:
    """(sid, rid) of DuckDB's ``s <how> JOIN m ON condition`` over the same rows."""
    con = duckdb.connect()
    con.register("s", pa.table({"sid": [r[0] for r in stream], "x": [r[1] for r in stream]}))
    con.register(
        "m", pa.table({k: [r[i] for r in master] for i, k in enumerate(["rid", "y", "lo", "hi"])})
    )
    return con.execute(f"SELECT s.sid, m.rid FROM s {how} JOIN m ON {condition}").fetchall()


def predicate_for(kind: str, lower: float, upper: float) -> ThetaPredicate:
    if kind == "range":
        return ThetaPredicate(type="range", stream_column="x", lo="lo", hi="hi")
    if kind == "band":
        return ThetaPredicate(
            type="band", stream_column="x", master_column="y", lower=lower, upper=upper
        )
    return ThetaPredicate(type=kind, stream_column="x", master_column="y")  # type: ignore[arg-type]


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(sorted(ORACLE)),
    scheme=st.sampled_from(["adsp", "square", "dynamic", "full"]),
    skew=st.booleans(),
    memory=st.sampled_from([200.0, 2_000.0, 50_000.0]),
    sample_size=st.sampled_from([3, 10_000]),
)
def test_theta_join_equals_duckdb(
    spark: SparkSession,
    seed: int,
    kind: str,
    scheme: str,
    skew: bool,
    memory: float,
    sample_size: int,
) -> None:
    """Exact whatever the plan, including plans from a 3-key sample of each side."""
    rng = random.Random(seed)
    draw = (
        (lambda: round(rng.paretovariate(1.2), 1))
        if skew
        else (lambda: round(rng.uniform(0, 100), 1))
    )
    stream = [(i, None if rng.random() < 0.05 else draw()) for i in range(rng.randint(1, 120))]
    master = []
    for i in range(rng.randint(1, 80)):
        lo = draw()
        master.append((i, draw(), lo, lo + rng.choice([0.5, 3.0, 20.0])))
    lower, upper = rng.choice([(1.0, 1.0), (0.0, 2.5), (5.0, 0.5)])
    predicate = predicate_for(kind, lower, upper)
    s_df = spark.createDataFrame(stream, STREAM)
    m_df = spark.createDataFrame(master, MASTER)
    plan = theta_plan(
        s_df,
        m_df,
        predicate,
        memory,
        scheme,
        stream_row_bytes=16,
        master_row_bytes=32,
        buckets=8,
        sample_size=sample_size,
    )
    result = adsp_join(s_df, m_df, predicate, plan).select("sid", "rid")

    expected = duckdb_pairs(stream, master, ORACLE[kind].format(lower=lower, upper=upper))
    assert_same_multiset(result, expected)


@pytest.mark.parametrize("side", ["row", "column", "none"])
def test_every_pair_of_lines_meets_in_exactly_one_task(side: str) -> None:
    from joins.theta.adsp.plan import TaskArea

    rows, columns, extra = 3, 4, 2
    area = TaskArea(0, 0, 0, 0, rows, columns, extra if side != "none" else 0, side, (), (), 10)
    r_lines = rows + (1 if side == "row" else 0)
    s_lines = columns + (1 if side == "column" else 0)
    for r_line in range(r_lines):
        for s_line in range(s_lines):
            for r_pick in range(extra):
                for s_pick in range(extra):
                    shared = set(route_master_line(area, r_line, r_pick)) & set(
                        route_stream_line(area, s_line, s_pick)
                    )
                    assert len(shared) == 1, (r_line, s_line, r_pick, s_pick, shared)


def test_binning_and_flagged_adsp_keep_unmatched_rows(spark: SparkSession) -> None:
    from joins.baseline import binned_band_join_flagged, finish
    from joins.theta.adsp.join import adsp_join_flagged

    rng = random.Random(9)
    stream = [(i, round(rng.uniform(0, 50), 1)) for i in range(60)]
    master = [(i, round(rng.uniform(0, 50), 1), 0.0, 0.0) for i in range(40)]
    predicate = predicate_for("band", 0.5, 1.5)
    s_df = spark.createDataFrame(stream, STREAM).withColumn("_row_id", F.col("sid"))
    m_df = spark.createDataFrame(master, MASTER)
    con = duckdb.connect()
    con.register("s", pa.table({"sid": [r[0] for r in stream], "x": [r[1] for r in stream]}))
    con.register("m", pa.table({"rid": [r[0] for r in master], "y": [r[1] for r in master]}))
    expected = con.execute(
        "SELECT s.sid, m.rid FROM s LEFT JOIN m ON m.y BETWEEN s.x - 0.5 AND s.x + 1.5"
    ).fetchall()
    binned = finish(binned_band_join_flagged(s_df, m_df, predicate, "m", 3), "left")
    assert_same_multiset(binned.select("sid", "rid"), expected)
    plan = theta_plan(s_df, m_df, predicate, 300.0, "adsp", 16, 32, buckets=6)
    flagged = adsp_join_flagged(s_df, m_df, predicate, plan, "m", 3, "_row_id")
    assert_same_multiset(finish(flagged, "left").select("sid", "rid"), expected)
    versions = {r[0] for r in finish(flagged, "left").select("_version_m").collect()}
    assert versions == {3, None}


def left_join_pairs(
    spark: SparkSession,
    s_df: DataFrame,
    m_df: DataFrame,
    predicate: ThetaPredicate,
    scheme: str,
    task_memory: float,
    sample_size: int,
    samples: Samples | None,
    row_bytes: RowBytes = ROW_BYTES,
    broadcast: bool = True,
) -> list[Row]:
    """(sid, rid) of the flagged left join by ``scheme``, as the theta driver runs it."""
    from joins.baseline import finish

    joined = scheme_join_flagged(
        spark,
        s_df,
        m_df,
        predicate,
        scheme,
        master_name="m",
        master_version=1,
        row_id="_row_id",
        task_memory=task_memory,
        sample_size=sample_size,
        row_bytes=row_bytes,
        samples=samples,
        broadcast=broadcast,
    )
    return finish(joined, "left").select("sid", "rid").collect()


def band_master(rng: random.Random, rows: int, widths: tuple[float, float]) -> list[tuple]:
    """Master rows (id, value, lo, hi) on [0, 60] with bands of either width."""
    master = []
    for i in range(rows):
        lo = round(rng.uniform(0, 60), 1)
        master.append((i, round(rng.uniform(0, 60), 1), lo, lo + rng.choice(widths)))
    return master


@contextmanager
def broadcast_threshold(spark: SparkSession, value: str) -> Iterator[None]:
    """``spark.sql.autoBroadcastJoinThreshold`` set to ``value`` for the block."""
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", value)
    try:
        yield
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)


@pytest.mark.parametrize("kind", sorted(ORACLE))
def test_auto_joins_like_duckdb_for_every_predicate_kind(spark: SparkSession, kind: str) -> None:
    """``scheme: auto`` end to end (choice, then the chosen join) on the flagged left join."""

    rng = random.Random(len(kind))
    stream = [(i, None if i % 17 == 0 else round(rng.uniform(0, 60), 1)) for i in range(90)]
    master = band_master(rng, 50, (0.5, 4.0))
    predicate = predicate_for(kind, 0.5, 2.0)
    s_df = spark.createDataFrame(stream, STREAM).withColumn("_row_id", F.col("sid"))
    m_df = spark.createDataFrame(master, MASTER)
    choice, samples = resolve_scheme(spark, s_df, m_df, predicate, "auto", 100, ROW_BYTES)
    assert choice.scheme == ("binning" if kind == "band" else "spark"), choice
    assert samples is None  # a broadcastable master: the counts decided, no keys drawn
    actual = left_join_pairs(spark, s_df, m_df, predicate, choice.scheme, 300.0, 100, samples)
    expected = duckdb_pairs(stream, master, ORACLE[kind].format(lower=0.5, upper=2.0), "LEFT")
    assert_same_multiset(actual, expected)


class Unmeasured:
    """Row sizes that must not be asked for: measuring them would cost a job."""

    def stream(self) -> float:
        raise AssertionError("the stream's row size was measured")

    def master(self) -> float:
        raise AssertionError("the master's row size was measured")


UNMEASURED = Unmeasured()


@pytest.mark.parametrize("kind", ["range", "band"])
def test_auto_decides_a_small_join_on_size_estimates_with_no_job(
    spark: SparkSession, kind: str
) -> None:
    """A materialized cache holds exact rows: a range predicate against a small master goes
    to the nested loop, and a band join under ``sample_above_bytes`` bins even with
    broadcasting off and a hot bin, without a counting or sampling job; the join is exact."""

    rng = random.Random(11)
    stream = [(i, 7.0 if i < 140 else round(rng.uniform(0, 60), 1)) for i in range(160)]
    master = band_master(rng, 50, (0.5, 9.0))
    predicate = predicate_for(kind, 0.5, 2.0)
    s_df = spark.createDataFrame(stream, STREAM).withColumn("_row_id", F.col("sid")).cache()
    m_df = spark.createDataFrame(master, MASTER).cache()
    tracker = spark.sparkContext.statusTracker()
    try:
        with broadcast_threshold(spark, "-1" if kind == "band" else "10m"):
            assert (s_df.count(), m_df.count()) == (160, 50)  # materialized: exact row counts
            spark.sparkContext.setJobGroup("auto-by-size", "choosing may run no job")
            try:
                choice, samples = resolve_scheme(
                    spark, s_df, m_df, predicate, "auto", 20, UNMEASURED
                )
            finally:
                spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
            assert tracker.getJobIdsForGroup("auto-by-size") == []
            assert samples is None
            assert choice.scheme == ("binning" if kind == "band" else "spark"), choice
            assert "estimated" in choice.reason
            # Neither scheme plans, so neither measures rows.
            actual = left_join_pairs(
                spark, s_df, m_df, predicate, choice.scheme, 600.0, 20, None, UNMEASURED
            )
    finally:
        s_df.unpersist()
        m_df.unpersist()
    expected = duckdb_pairs(stream, master, ORACLE[kind].format(lower=0.5, upper=2.0), "LEFT")
    assert_same_multiset(actual, expected)


@pytest.mark.parametrize("kind", ["range", "band"])
def test_auto_without_broadcast_runs_adsp_from_its_own_samples(
    spark: SparkSession, kind: str
) -> None:
    """Broadcasting off: a range predicate, and a band whose hot bin holds over 3/4 of all
    input rows (A-DSP's 1.5x work over 2 tasks at once), go to A-DSP, planned from the
    samples the choice drew."""

    rng = random.Random(5)
    stream = [(i, 7.0 if i < 155 else round(rng.uniform(0, 60), 1)) for i in range(160)]
    master = band_master(rng, 10, (0.5, 9.0))
    predicate = predicate_for(kind, 0.5, 2.0)
    s_df = spark.createDataFrame(stream, STREAM).withColumn("_row_id", F.col("sid"))
    m_df = spark.createDataFrame(master, MASTER)
    with broadcast_threshold(spark, "-1"):
        # sample_above_bytes 0: inputs this small would bin on their size estimate alone.
        choice, samples = resolve_scheme(spark, s_df, m_df, predicate, "auto", 20, ROW_BYTES, 0)
        assert choice.scheme == "adsp", choice
        assert samples is not None and samples[0].rows == 160 and samples[1].rows == 10
        actual = left_join_pairs(
            spark, s_df, m_df, predicate, choice.scheme, 600.0, 20, samples, broadcast=False
        )
    expected = duckdb_pairs(stream, master, ORACLE[kind].format(lower=0.5, upper=2.0), "LEFT")
    assert_same_multiset(actual, expected)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bounds=st.lists(st.integers(-50, 50), min_size=0, max_size=40, unique=True).map(
        lambda b: tuple(sorted(float(v) for v in b))
    )
)
def test_bucket_of_places_every_value_as_the_histogram_does(
    spark: SparkSession, bounds: tuple[float, ...]
) -> None:
    """The binary search in SQL against ``Histogram.bucket``: every boundary, values just
    either side of one, outside all of them, NaN (the last bucket) and null (no bucket)."""
    histogram = Histogram(bounds, (1.0,) * (len(bounds) + 1))
    values: list[float | None] = [-1e9, 1e9, 0.0, math.nan, None]
    for b in bounds:
        values += [b, b - 0.5, b + 0.5]
    frame = spark.createDataFrame(
        [(v,) for v in values], T.StructType([T.StructField("v", T.DoubleType())])
    )
    placed = frame.select("v", bucket_of(F.col("v"), histogram).alias("b")).collect()
    for row in placed:
        if row.v is None:
            assert row.b is None
        elif math.isnan(row.v):
            assert row.b == len(bounds)
        else:
            assert row.b == histogram.bucket(row.v), (row.v, row.b)
