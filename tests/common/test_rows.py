"""Rows as Arrow or Spark: each source converts to the other form, a transform runs on
either, and the two primitives narwhals lacks on Spark agree with Arrow's. ``rows_where``
is ``Table.filter`` and ``rows_at`` is ``Table.take``: the same rows in the same order,
sliced when they are one run."""

from __future__ import annotations

import datetime as dt

import narwhals.stable.v2 as nw
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.rows import (
    MAX_RUNS,
    Frame,
    Rows,
    rows_at,
    rows_where,
    with_epoch_micros,
    with_timestamp_of_micros,
)
from tests.conftest import REPO_ROOT
from tests.helpers import assert_imports_none_of
from tests.rows_check import rows_both_ways

UTC = dt.UTC


def _doubled_evens(frame: Frame, column: str) -> Frame:
    return frame.filter(nw.col(column) % 2 == 0).select((nw.col(column) * 2).alias("twice"))


def test_a_source_in_one_form_converts_to_the_other(spark: SparkSession) -> None:
    table = pa.table({"id": pa.array([1, 2, 2, None], pa.int64())})
    from_arrow = rows_both_ways(Rows.of(table), spark)
    frame = spark.createDataFrame([(1,), (2,), (2,), (None,)], "id long")
    assert rows_both_ways(Rows.of(frame), spark) == from_arrow
    assert [r["id"] for r in from_arrow] == [1, 2, 2, None]  # duplicates kept


def test_a_transform_runs_on_the_form_asked_for(spark: SparkSession) -> None:
    reads: list[str] = []

    def arrow() -> pa.Table:
        reads.append("arrow")
        return pa.table({"n": pa.array([1, 2, 3, 4, 4], pa.int64())})

    def on_spark():  # type: ignore[no-untyped-def]
        reads.append("spark")
        return spark.createDataFrame([(1,), (2,), (3,), (4,), (4,)], "n long")

    source = Rows.read(arrow=arrow, spark=on_spark)
    doubled = Rows.apply(_doubled_evens, source, column="n")
    assert doubled.to_arrow().column("twice").to_pylist() == [4, 8, 8]
    assert reads == ["arrow"]  # no Spark frame was planned for the driver's read
    assert sorted(r["twice"] for r in doubled.to_spark().collect()) == [4, 8, 8]
    assert reads == ["arrow", "spark"]
    doubled.to_arrow()
    assert reads == ["arrow", "spark"]  # each form is read once


def test_rows_read_into_the_driver_need_a_session_for_spark() -> None:
    rows = Rows.of(pa.table({"a": [1]}))
    with pytest.raises(ValueError, match="SparkSession is needed"):
        rows.to_spark()
    with pytest.raises(ValueError, match="a way to read them"):
        Rows()


def test_epoch_micros_round_trip_on_both_engines(spark: SparkSession) -> None:
    times = [
        dt.datetime(2026, 1, 1, 10, 59, 59, 999999, tzinfo=UTC),
        dt.datetime(1969, 12, 31, 23, 30, 0, 1, tzinfo=UTC),  # before the epoch
        None,
    ]
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField("t", T.TimestampType())]
    )
    frame = spark.createDataFrame(list(enumerate(times)), schema)

    def micros(rows: Frame) -> Frame:
        stamped = with_epoch_micros(rows, "t", "us")
        return with_timestamp_of_micros(stamped, "us", "back")

    got = rows_both_ways(Rows.apply(micros, Rows.of(frame)), spark)
    expected = [None if t is None else int(t.timestamp() * 1_000_000) for t in times]
    assert (
        [r["us"] for r in sorted(got, key=lambda r: r["id"])]
        == [
            1767265199999999,
            -1799999999,
            None,
        ]
        == expected
    )
    assert all(r["back"] == r["t"] for r in got)


masks = st.lists(st.sampled_from([True, False, None]), max_size=40)


def _table(n: int) -> pa.Table:
    # Two chunks, so a slice spans a chunk boundary when the run does.
    half = n // 2
    return pa.Table.from_batches(
        [
            pa.record_batch({"i": pa.array(range(half), pa.int64())}),
            pa.record_batch({"i": pa.array(range(half, n), pa.int64())}),
        ]
    )


def _shares_buffers(kept: pa.Table, table: pa.Table) -> bool:
    """Zero-copy: the first kept value lives in one of the table's own buffers."""
    chunk = kept.column("i").chunks[0]
    source = [c for c in table.column("i").chunks if len(c)]
    return any(chunk.buffers()[1].address == c.buffers()[1].address for c in source)


@settings(deadline=None)  # the first calls load Arrow's kernels
@given(masks)
def test_rows_where_keeps_what_filter_keeps(mask: list[bool | None]) -> None:
    table = _table(len(mask))
    mask_array = pa.array(mask, pa.bool_())
    assert rows_where(table, mask_array).equals(table.filter(mask_array))


def one_run(shortest: int) -> st.SearchStrategy[tuple[int, int, int]]:
    """(rows before, rows in, rows after) a run of consecutive rows."""
    return st.tuples(st.integers(0, 30), st.integers(shortest, 30), st.integers(0, 30))


@settings(deadline=None)  # the first calls load Arrow's kernels
@given(one_run(shortest=0))
def test_one_run_is_a_slice_of_the_same_buffers(case: tuple[int, int, int]) -> None:
    before, run, after = case
    table = _table(before + run + after)
    mask = pa.array([False] * before + [True] * run + [False] * after, pa.bool_())
    kept = rows_where(table, mask)
    assert kept.column("i").to_pylist() == list(range(before, before + run))
    if run:
        assert _shares_buffers(kept, table)


def test_a_mask_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="a mask of 2 values for a table of 3 rows"):
        rows_where(_table(3), pa.array([True, False]))


@settings(deadline=None)  # the first calls load Arrow's kernels
@given(
    st.integers(0, 30).flatmap(
        lambda n: st.tuples(
            st.just(n), st.lists(st.integers(0, max(n - 1, 0)), max_size=30 if n else 0)
        )
    )
)
def test_rows_at_takes_what_take_takes(case: tuple[int, list[int]]) -> None:
    n, positions = case
    table = _table(n)
    at = pa.array(positions, pa.int64())
    assert rows_at(table, at).equals(table.take(at))


@settings(deadline=None)  # the first calls load Arrow's kernels
@given(one_run(shortest=1))
def test_rows_at_counting_up_is_a_slice(case: tuple[int, int, int]) -> None:
    before, run, after = case
    table = _table(before + run + after)
    kept = rows_at(table, pa.array(range(before, before + run), pa.int64()))
    assert kept.column("i").to_pylist() == list(range(before, before + run))
    assert _shares_buffers(kept, table)


def test_rows_at_past_the_end_is_refused_as_take_refuses_it() -> None:
    with pytest.raises(IndexError):
        rows_at(_table(3), pa.array([2, 3], pa.int64()))


@settings(deadline=None)  # the first calls load Arrow's kernels
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(1, 5)), min_size=2, max_size=6))
def test_a_few_runs_are_slices_of_the_same_buffers(runs: list[tuple[int, int]]) -> None:
    # (gap before, length) of each run: the kept rows, in order, and no copy of them.
    mask: list[bool] = []
    for gap, length in runs:
        mask += [False] * gap + [True] * length
    table = _table(len(mask) + 3)
    mask_array = pa.array(mask + [False] * 3, pa.bool_())
    kept = rows_where(table, mask_array)
    assert kept.equals(table.filter(mask_array))
    assert _shares_buffers(kept, table)


def test_many_runs_are_taken_not_sliced() -> None:
    # Every other row: one run per kept row, copied into one chunk by take.
    n = 4 * MAX_RUNS
    table = _table(n)
    mask = pa.array([i % 2 == 0 for i in range(n)], pa.bool_())
    kept = rows_where(table, mask)
    assert kept.equals(table.filter(mask))
    assert kept.column("i").num_chunks == 1


def test_selecting_rows_loads_no_spark() -> None:
    """The Spark-free algorithm modules select rows here: importing them loads no Spark."""
    assert_imports_none_of(
        "import common.rows, joins.ssbj.columnar, joins.ssbj.bucket_decode", ["pyspark"], REPO_ROOT
    )
