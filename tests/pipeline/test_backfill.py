"""Backfills replace an interval atomically and never duplicate what live SSBJ holds pending."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipeline.backfill import rejoin_interval
from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import BASE_TIME, SsbjHarness

pytestmark = pytest.mark.slow


def test_backfill_with_tuples_pending_then_live_catch_up(
    spark: SparkSession, tmp_path: Path
) -> None:
    """On the embedded engine; the native engine's backfill is the both-engines test's
    (tests/pipeline/test_pipeline_on_both_engines.py: every table equal to the embedded
    run's after a backfill), its Delta operations tests/warehouse/delta/test_engines.py's."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 3, 1, "left")
    h.load_master([(k, s, float(k + s)) for k in range(1, 5) for s in range(k % 3)], files=3)
    h.arrive([(i, i % 6) for i in range(0, 8)])
    h.run()  # batch A: 1 of 3 partitions scanned, its tuples still pending
    h.arrive([(i, i % 6) for i in range(8, 14)])  # batch B: not yet consumed by the live stage
    start = BASE_TIME.replace(tzinfo=dt.UTC)
    rejoin_interval(h.runner, start, start + dt.timedelta(hours=1), "backfill")
    everything_so_far = h.oracle_for_batches([list(range(0, 14))], how="left")
    assert_same_multiset(h.output(), everything_so_far)

    h.run()
    h.drain()  # live steps finish A and consume B; both were already published by the backfill
    assert_same_multiset(h.output(), everything_so_far)

    h.arrive([(i, i % 6) for i in range(14, 20)])  # late data for the same interval
    h.run()
    h.drain()
    assert_same_multiset(h.output(), h.oracle_for_batches([list(range(0, 20))], how="left"))


@pytest.mark.parametrize("mode", ["ssbj", "baseline"])
def test_backfill_after_the_master_changed_joins_the_master_as_of_the_interval(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    """A backfill re-joins an interval against the master version in force at the
    interval's end, not the latest one (DESIGN.md, backfills). A two-second schedule puts
    an interval around now: the master's first version is committed before the interval
    ends and an update after it, so the version as of the interval is the first, and the
    backfilled output equals the live one (DuckDB oracle at the tuples' pinned version)."""
    h = SsbjHarness(
        spark, tmp_path, mode, 2, 1, "left", extra_config={"schedule": {"interval": "2s"}}
    )
    h.load_master([(k, s, float(k + s)) for k in range(1, 5) for s in range(k % 3)], files=2)
    now = dt.datetime.now(dt.UTC)
    start = now.replace(microsecond=0) - dt.timedelta(seconds=now.second % 2)
    end = start + dt.timedelta(seconds=2)
    h.arrive([(i, i % 6) for i in range(8)], at=start.replace(tzinfo=None))
    h.run()
    h.drain()
    live = h.output()
    assert_same_multiset(live, h.oracle("left"))
    while dt.datetime.now(dt.UTC) <= end + dt.timedelta(milliseconds=200):
        time.sleep(0.1)
    h.update_master([(1, 0, -5.0), (3, 7, 3.5)], [(2, 0)])  # after the interval ended

    rejoin_interval(h.runner, start, end, "backfill")
    assert_same_multiset(h.output(), live)
    assert {r[5] for r in h.output() if r[5] is not None} == {1}  # the master's version 1
