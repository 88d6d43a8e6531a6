"""A step's rows without the tuples a backfill already joined: one predicate, the same rows
from a Spark frame and from an Arrow table."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from pyspark.sql import SparkSession

from joins.columns import INTERVAL_START
from joins.ssbj.late import LATE_SINCE
from joins.ssbj.roles import LATE, PENDING, ROLE, stream_field
from joins.ssbj.step import INPUT_VERSION
from pipeline.ssbj.placement import suppressed, suppressed_pending
from pipeline.ssbj.state import ControllerState

UTC = dt.UTC
TEN = dt.datetime(2026, 1, 1, 10, tzinfo=UTC)


def _state(*backfills: tuple[dt.datetime, dt.datetime, int]) -> ControllerState:
    return ControllerState(
        layout=1,
        next_step=0,
        cycle_base=0,
        partitions=2,
        cache_version=None,
        switch_version=None,
        chunks={},
        backfills=[
            # a naive ISO time is UTC, as a backfill recorded it
            {"start": s.replace(tzinfo=None).isoformat(), "end": e.isoformat(), "input_version": v}
            for s, e, v in backfills
        ],
    )


def _ids(rows: pa.Table) -> list[int]:
    return sorted(rows.column("id").to_pylist())


def test_new_rows_a_backfill_joined_are_dropped_in_either_form(spark: SparkSession) -> None:
    hour = dt.timedelta(hours=1)
    rows = pa.table(
        {
            "id": [1, 2, 3, 4, 5],
            INTERVAL_START: pa.array(
                [TEN, TEN, TEN + hour, None, TEN + 2 * hour], pa.timestamp("us", "UTC")
            ),
            INPUT_VERSION: pa.array([3, 5, 3, 3, None], pa.int64()),
        }
    )
    state = _state((TEN, TEN + 2 * hour, 4))  # versions up to 4 of [10:00, 12:00)
    # 1 and 3 are covered; 2 came later (v5); 4 and 5 have no interval or version: kept
    kept = suppressed(rows, state, INTERVAL_START, INPUT_VERSION)
    assert _ids(kept) == [2, 4, 5]
    on_spark = suppressed(spark.createDataFrame(rows), state, INTERVAL_START, INPUT_VERSION)
    assert _ids(on_spark.toArrow()) == [2, 4, 5]
    assert suppressed(rows, _state(), INTERVAL_START, INPUT_VERSION) is rows  # no backfill


def test_only_pending_tuples_that_never_waited_are_dropped(spark: SparkSession) -> None:
    rows = pa.table(
        {
            ROLE: [PENDING, PENDING, LATE, PENDING],
            "id": [1, 2, 3, 4],
            stream_field(INTERVAL_START): pa.array([TEN] * 4, pa.timestamp("us", "UTC")),
            stream_field(INPUT_VERSION): pa.array([1, 1, 1, 9], pa.int64()),
            LATE_SINCE: pa.array([None, 17, 17, None], pa.int64()),
        }
    )
    state = _state((TEN, TEN + dt.timedelta(hours=1), 4))
    # 1: held in H_S and covered; 2 waits for a late master row; 3 is a late row; 4 is newer
    assert _ids(suppressed_pending(rows, state)) == [2, 3, 4]
    assert _ids(suppressed_pending(spark.createDataFrame(rows), state).toArrow()) == [2, 3, 4]
