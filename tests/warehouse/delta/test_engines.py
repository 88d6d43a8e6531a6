"""Both Delta engines, embedded (delta-rs log + Spark Parquet) and native (delta-spark), on
the same assertions: round trips, snapshots, time travel, replace, merge, changes, rows
added, vacuum with pins, app transactions, commit guards, concurrent writers, schema drift.

The tests' Spark session always has the delta-spark jars (tests/conftest.py), so every test
taking ``engine`` runs once per engine, with no skips. Concurrent writers are real: a write
is held mid-way by a Python UDF in its data (:class:`Gate`) while another writer commits.
The tests after "embedded engine internals" exercise delta-rs-specific recovery paths by
making delta-rs calls fail; they have no native counterpart (delta-spark writes and commits
in one JVM call).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import (
    CommitError,
    ConcurrentModificationError,
    ConfigError,
    DeltaTableError,
    NotAppendOnlyError,
    SchemaMismatchError,
    TableNotFoundError,
    UnsupportedOperationError,
    UnsupportedTableFeatureError,
)
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset
from warehouse.delta import (
    AppTransaction,
    CommitOutcome,
    DeltaEngine,
    PartitionFilter,
    open_engine,
)
from warehouse.delta.embedded import COMMIT_ID_KEY, EmbeddedDeltaEngine
from warehouse.spark import DELTA_JARS_ENV

UTC = dt.UTC
ENGINES = ["embedded", "native"]
ALL_PARTITIONS = ("label", "day", "at")


def layouts(*partition_bys: tuple[str, ...]) -> pytest.MarkDecorator:
    """``engine`` (indirect) and ``partition_by``: every layout on the embedded engine,
    whose own code writes each; on the native one, whose writes are delta-spark's, the
    layout with every partition column (the superset case: partition paths, typed
    values, awkward characters). Each native case costs several delta-spark commits."""
    cases = [("embedded", p) for p in partition_bys]
    cases += [("native", p) for p in partition_bys if p == ALL_PARTITIONS]
    return pytest.mark.parametrize(("engine", "partition_by"), cases, indirect=["engine"])


SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("label", T.StringType()),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("amount", T.DoubleType()),
    ]
)

AWKWARD_ROWS = [
    (1, "a b", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10, 0, tzinfo=UTC), 1.5),
    (2, "x/y:z%", dt.date(2024, 1, 2), dt.datetime(2024, 1, 1, 10, 0, 0, 123456, tzinfo=UTC), 2.0),
    (3, None, None, None, None),
    (4, "a+b[1]=c", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10, 0, tzinfo=UTC), -1.0),
    (5, "é ü %20", dt.date(1999, 12, 31), dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=UTC), 0.0),
    (6, "a b", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10, 0, tzinfo=UTC), 7.25),
    (7, "it's \\ `q`", dt.date(2024, 1, 3), dt.datetime(2024, 1, 3, tzinfo=UTC), 3.0),
]

LABELS = [(1, "a", None, None, 1.0), (2, "b", None, None, 2.0)]
REPLACEMENT = [(9, "a", None, None, 9.0), (10, "a", None, None, 10.0)]


def labelled_table(spark: SparkSession, engine: DeltaEngine, tmp_path: Path) -> str:
    """A table of LABELS partitioned by label, at version 1; its path."""
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    engine.append(path, spark.createDataFrame(LABELS, SCHEMA))
    return path


def naive(rows: list[tuple]) -> list[tuple]:
    """Spark returns UTC timestamps as naive datetimes in a UTC session."""
    return [tuple(plain(v) for v in r) for r in rows]


def plain(value: Any) -> Any:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def make_engine(spark: SparkSession, name: str) -> DeltaEngine:
    """A fresh engine of ``name``; the native one through the product's engine choice."""
    if name == "native":
        return open_engine(spark, "native")
    return EmbeddedDeltaEngine(spark)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, spark: SparkSession) -> DeltaEngine:
    """Each test taking this runs once on each engine."""
    return make_engine(spark, request.param)


@pytest.fixture
def embedded(spark: SparkSession) -> EmbeddedDeltaEngine:
    return EmbeddedDeltaEngine(spark)


@pytest.fixture
def through_delta_rs(spark: SparkSession) -> EmbeddedDeltaEngine:
    """An embedded engine that commits every write through delta-rs, as it does for the
    tables its log writer may not write: the tests of delta-rs's commit seams take it."""
    return EmbeddedDeltaEngine(spark, write_log=False)


class Gate:
    """Holds a write mid-way, after its transaction started and before it commits.

    :meth:`hold` routes one column of the data through a Python UDF that, on the first
    row, marks that the write started and then waits until :meth:`run` has let the
    concurrent action happen. The data is one partition, so one of the session's two cores
    stays free for the concurrent writer.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.started = directory / "started"
        self.released = directory / "released"

    def hold(self, frame: DataFrame, column: str = "amount") -> DataFrame:
        started, released = str(self.started), str(self.released)
        data_type = frame.schema[column].dataType

        def wait(value):  # type: ignore[no-untyped-def]  # no hints: a plain Python UDF
            import os
            import time

            open(started, "a").close()
            deadline = time.monotonic() + 300
            while not os.path.exists(released):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"gate {released} was never released")
                time.sleep(0.05)
            return value

        gate = F.udf(wait, data_type)
        return frame.coalesce(1).withColumn(column, gate(F.col(column)))

    def run(self, write: Callable[[], Any], concurrent: Callable[[], Any]) -> Any:
        """Start ``write``; once it is held, run ``concurrent``, release, return its result."""
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(write)
            deadline = time.monotonic() + 300
            while not self.started.exists():
                if future.done():
                    return future.result()  # finished (or failed) without reaching the gate
                assert time.monotonic() < deadline, "the held write never started"
                time.sleep(0.05)
            try:
                concurrent()
            finally:
                self.released.touch()
            return future.result()


# ---------------------------------------------------------------------- reads and writes


@layouts((), ("label",), ALL_PARTITIONS)
def test_round_trip_keeps_awkward_partition_values(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, partition_by)
    engine.append(path, spark.createDataFrame(AWKWARD_ROWS, SCHEMA))

    assert_same_multiset(engine.read(path), naive(AWKWARD_ROWS))
    # delta-rs reading the same table on its own is an independent check of the log.
    independent = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert_same_multiset(
        naive([tuple(r[c] for c in SCHEMA.fieldNames()) for r in independent]),
        naive(AWKWARD_ROWS),
    )


def test_snapshot_lists_live_files_with_counts_and_typed_partition_values(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label", "day", "at"))
    engine.append(path, spark.createDataFrame(AWKWARD_ROWS, SCHEMA))
    engine.replace(
        path,
        spark.createDataFrame([(8, "a b", None, None, 8.0)], SCHEMA),
        [PartitionFilter("label", "=", "a b")],
    )
    expected = [r for r in naive(AWKWARD_ROWS) if r[1] != "a b"] + [(8, "a b", None, None, 8.0)]
    snapshot = engine.snapshot(path)

    assert snapshot.version == 2
    assert snapshot.partition_columns == ("label", "day", "at")
    assert snapshot.schema.fieldNames() == SCHEMA.fieldNames()
    assert sum(f.num_records or 0 for f in snapshot.files) == len(expected)
    assert all(f.size_bytes == os.path.getsize(f.path) for f in snapshot.files)
    assert snapshot.size_bytes == sum(f.size_bytes for f in snapshot.files)
    # Every file's rows carry exactly the partition values the snapshot gives for it.
    for data_file in snapshot.files:
        values = tuple(plain(data_file.partition_values[c]) for c in ("label", "day", "at"))
        rows = engine.read_files(snapshot, [data_file]).collect()
        assert rows and {(r.label, r.day, r.at) for r in rows} == {values}
        assert len(rows) == data_file.num_records
    assert_same_multiset(engine.read_files(snapshot, list(snapshot.files)), expected)
    chosen = [f for f in snapshot.files if f.partition_values["label"] == "x/y:z%"]
    assert_same_multiset(engine.read_files(snapshot, chosen), [expected[0]])


def test_read_files_gives_partition_values_from_one_and_from_many_partitions(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    """One partition's files are read with its values as literals, several partitions'
    through one scan and a lookup (the embedded engine's two paths); both give every row
    its own values, a null partition value too."""
    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("label", T.StringType()),
            T.StructField("at", T.TimestampType()),
        ]
    )
    rows = [
        (i, None if i == 0 else f"p{i % 12} '`", dt.datetime(2024, 1, 1, i % 12, 30, tzinfo=UTC))
        for i in range(36)
    ]
    path = str(tmp_path / "t")
    engine.create_table(path, schema, ("label", "at"))
    engine.append(path, spark.createDataFrame(rows, schema))
    snapshot = engine.snapshot(path)
    assert len({tuple(f.partition_values.values()) for f in snapshot.files}) == 13

    assert_same_multiset(engine.read_files(snapshot), naive(rows))
    for labels in [(None,), ("p1 '`",), (None, "p1 '`", "p2 '`")]:
        chosen = [f for f in snapshot.files if f.partition_values["label"] in labels]
        expected = naive([r for r in rows if r[1] in labels])
        assert_same_multiset(engine.read_files(snapshot, chosen), expected)


def test_time_travel_survives_appends_replace_and_vacuum(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    first = [(1, "a", None, None, 1.0), (2, "b", None, None, 2.0)]
    second = [(3, "a", None, None, 3.0)]
    replacement = [(9, "a", None, None, 9.0)]
    v1 = engine.append(path, spark.createDataFrame(first, SCHEMA)).table_version
    v2 = engine.append(path, spark.createDataFrame(second, SCHEMA)).table_version
    time.sleep(0.3)
    between = dt.datetime.now(UTC)
    time.sleep(0.3)
    v3 = engine.replace(
        path, spark.createDataFrame(replacement, SCHEMA), [PartitionFilter("label", "=", "a")]
    ).table_version
    assert (v1, v2, v3) == (1, 2, 3)

    engine.vacuum(path, retention_hours=0, keep_versions=[v1, v2])

    assert_same_multiset(engine.read(path, version=v1), first)
    assert_same_multiset(engine.read(path, version=v2), first + second)
    assert_same_multiset(engine.read(path, timestamp=between), first + second)
    assert engine.snapshot(path, timestamp=between).version == v2
    assert_same_multiset(engine.read(path), [first[1], *replacement])


def test_vacuum_without_pins_drops_old_versions_files(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    engine.append(path, spark.createDataFrame([(1, "a", None, None, 1.0)], SCHEMA).coalesce(1))
    replaced = {f.path for f in engine.snapshot(path).files}
    engine.replace(
        path,
        spark.createDataFrame([(2, "a", None, None, 2.0)], SCHEMA),
        [PartitionFilter("label", "=", "a")],
    )
    deleted = engine.vacuum(path, retention_hours=0)
    assert len(deleted) == 1
    assert not any(os.path.exists(p) for p in replaced)
    assert_same_multiset(engine.read(path), [(2, "a", None, None, 2.0)])


def test_replace_predicates_and_rows_outside_them(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = labelled_table(spark, engine, tmp_path)
    data = spark.createDataFrame([(1, "a", None, None, 5.0)], SCHEMA)
    with pytest.raises(DeltaTableError, match="outside the replace predicate"):
        engine.replace(path, data, [PartitionFilter("label", "=", "b")])
    assert engine.snapshot(path).version == 1

    # No predicate is no replace (overwrite is the call for the whole table).
    with pytest.raises(DeltaTableError, match="needs a predicate"):
        engine.replace(path, data, [])
    assert engine.snapshot(path).version == 1

    by_data_column = [PartitionFilter("id", "=", 1)]
    if engine.name == "embedded":
        # A file-list engine can replace only whole partitions.
        with pytest.raises(UnsupportedOperationError, match="native delta-spark engine"):
            engine.replace(path, data, by_data_column)
        assert_same_multiset(engine.read(path), LABELS)
    else:
        assert engine.replace(path, data, by_data_column).committed
        assert_same_multiset(engine.read(path), [(1, "a", None, None, 5.0), LABELS[1]])


def test_replace_arrow_replaces_only_the_selected_partitions_exactly_once(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("part", T.LongType())])
    path = str(tmp_path / "t")
    engine.create_table(path, schema, ("part",))
    engine.append(path, spark.createDataFrame([(1, 1), (2, 2), (3, 3)], schema))
    rows = pa.table(
        {"id": pa.array([20, 21, 40], pa.int64()), "part": pa.array([2, 2, 4], pa.int64())}
    )
    where = [PartitionFilter("part", "in", [1, 2, 4])]
    txn = AppTransaction("segments", 1)
    outcome = engine.replace(path, rows, where, txn)
    assert outcome.committed
    # Partition 1 is removed (no rows given), 2 replaced, 4 added, 3 untouched.
    assert_same_multiset(engine.read(path), [(20, 2), (21, 2), (3, 3), (40, 4)])
    again = engine.replace(path, rows.slice(0, 1), where, txn)  # a rerun: skipped
    assert not again.committed
    assert_same_multiset(engine.read(path), [(20, 2), (21, 2), (3, 3), (40, 4)])
    with pytest.raises(DeltaTableError, match="outside the replace predicate"):
        engine.replace(path, rows, [PartitionFilter("part", "=", 2)])
    assert engine.snapshot(path).version == outcome.table_version


def test_replace_range_of_dates(spark: SparkSession, engine: DeltaEngine, tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("day",))
    days = [dt.date(2024, 1, d) for d in (1, 2, 3, 4)]
    engine.append(
        path, spark.createDataFrame([(i, "x", d, None, 0.0) for i, d in enumerate(days)], SCHEMA)
    )
    new = [
        (10, "y", days[1], None, 1.0),
        (11, "y", days[2], None, 1.0),
        (12, "y", days[2], None, 2.0),
    ]
    outcome = engine.replace(
        path,
        spark.createDataFrame(new, SCHEMA),
        [PartitionFilter("day", ">=", days[1]), PartitionFilter("day", "<", days[3])],
    )
    assert outcome.committed and outcome.rows_added == 3 and outcome.files_added >= 2
    assert_same_multiset(
        engine.read(path), [(0, "x", days[0], None, 0.0), *new, (3, "x", days[3], None, 0.0)]
    )


KV_SCHEMA = T.StructType([T.StructField("k", T.LongType()), T.StructField("v", T.StringType())])


def merge_into_a_cdf_table(spark: SparkSession, engine: DeltaEngine, path: str) -> CommitOutcome:
    """A change-data-feed table of (1, a), (2, b), (3, c) (version 1), then one MERGE on
    ``k``: 2 updated to B, 3 deleted, (4, d) inserted (version 2)."""
    engine.create_table(path, KV_SCHEMA, (), {"delta.enableChangeDataFeed": "true"})
    engine.append(path, spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], KV_SCHEMA))
    flagged = T.StructType([*KV_SCHEMA.fields, T.StructField("deleted", T.BooleanType())])
    changes = spark.createDataFrame([(2, "B", False), (3, None, True), (4, "d", False)], flagged)
    return engine.merge(path, changes, ["k"], delete_flag="deleted")


def test_merge_upserts_and_deletes_and_feeds_cdf(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "m")
    outcome = merge_into_a_cdf_table(spark, engine, path)

    assert outcome.committed and outcome.table_version == 2
    assert_same_multiset(engine.read(path), [(1, "a"), (2, "B"), (4, "d")])
    feed = engine.changes(path, 1, outcome.table_version)
    assert feed.columns == ["k", "v", "_change_type", "_commit_version"]
    assert_same_multiset(
        feed,
        [
            (2, "b", "update_preimage", 2),
            (2, "B", "update_postimage", 2),
            (3, "c", "delete", 2),
            (4, "d", "insert", 2),
        ],
    )
    assert_same_multiset(
        engine.changes(path, 0, 1),
        [(1, "a", "insert", 1), (2, "b", "insert", 1), (3, "c", "insert", 1)],
    )


def test_changes_of_append_only_table_without_cdf(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    batches = [
        [(1, "a", None, None, 1.0)],
        [(2, "b", None, None, 2.0), (3, "a", None, None, 3.0)],
        [(4, "c", None, None, 4.0)],
    ]
    for batch in batches:
        engine.append(path, spark.createDataFrame(batch, SCHEMA))
    feed = engine.changes(path, 1, 3)
    assert_same_multiset(
        feed.select("id", "label", "_change_type", "_commit_version"),
        [(2, "b", "insert", 2), (3, "a", "insert", 2), (4, "c", "insert", 3)],
    )
    assert engine.changes(path, 3, 3).count() == 0
    engine.replace(
        path,
        spark.createDataFrame([(5, "a", None, None, 5.0)], SCHEMA),
        [PartitionFilter("label", "=", "a")],
    )
    with pytest.raises(NotAppendOnlyError, match="enableChangeDataFeed"):
        engine.changes(path, 3, 4)
    # A stage reading its input asks for the added rows, whatever was removed.
    assert_same_multiset(engine.rows_added(path, 3, 4).select("id", "_commit_version"), [(5, 4)])


def test_rows_added_are_the_live_rows_of_files_added_in_the_range(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    v1 = [(1, "a", None, None, 1.0), (2, "b", None, None, 2.0)]
    v2 = [(3, "a", None, None, 3.0), (4, "c", None, None, 4.0)]
    v3 = [(5, "b", None, None, 5.0)]
    v4 = [(6, "a", None, None, 6.0)]  # replaces partition a: drops rows 1 and 3
    v5 = [(7, "c", None, None, 7.0)]
    for rows in (v1, v2, v3):
        engine.append(path, spark.createDataFrame(rows, SCHEMA))
    engine.replace(path, spark.createDataFrame(v4, SCHEMA), [PartitionFilter("label", "=", "a")])
    engine.append(path, spark.createDataFrame(v5, SCHEMA))

    def added(after: int, to: int, skip: tuple[int, ...] = ()) -> DataFrame:
        frame = engine.rows_added(path, after, to, skip)
        assert frame.columns == [*SCHEMA.fieldNames(), "_commit_version"]
        # the same count from the log alone (what lets a small audit run in memory)
        assert engine.count_rows_added(path, after, to, skip) == frame.count()
        return frame

    assert_same_multiset(
        added(0, 5),
        [(*r, 1) for r in v1[1:]] + [(*v2[1], 2)] + [(*v3[0], 3), (*v4[0], 4), (*v5[0], 5)],
    )
    assert_same_multiset(added(1, 3), [(*r, 2) for r in v2] + [(*v3[0], 3)])
    assert_same_multiset(added(1, 5, (3, 4)), [(*v2[1], 2), (*v5[0], 5)])
    assert added(5, 5).count() == 0
    # the same ranges from the log's statistics alone: rows each version's files added
    assert engine.rows_by_version(path, 0, 5) == [(1, 2), (2, 2), (3, 1), (4, 1), (5, 1)]
    assert engine.rows_by_version(path, 3, 4) == [(4, 1)]
    assert engine.rows_by_version(path, 5, 5) == []


@layouts((), ALL_PARTITIONS)
def test_read_arrow_reads_what_read_files_reads(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, partition_by)
    engine.append(path, spark.createDataFrame(AWKWARD_ROWS[:4], SCHEMA))
    engine.append(path, spark.createDataFrame(AWKWARD_ROWS[4:], SCHEMA))
    snapshot = engine.snapshot(path)
    whole = engine.read_arrow(snapshot)
    assert whole.column_names == SCHEMA.fieldNames()
    rows = naive([tuple(r.values()) for r in whole.to_pylist()])
    assert_same_multiset(engine.read_files(snapshot), rows)
    assert_same_multiset(rows, naive(AWKWARD_ROWS))
    # some files, some columns in the asked order, filtered as read
    first = [f for f in snapshot.files if f in engine.snapshot(path, 1).files]
    asked = engine.read_arrow(
        snapshot, first, ["day", "id"], lambda r: pc.greater(r.column("id"), 1)
    )
    assert asked.column_names == ["day", "id"]
    assert sorted(asked.to_pylist(), key=str) == sorted(
        [{"day": r[2], "id": r[0]} for r in AWKWARD_ROWS[1:4]], key=str
    )
    assert engine.read_arrow(snapshot, []).num_rows == 0
    with pytest.raises(TypeError, match=r"\(RowMask\), found Expression"):
        engine.read_arrow(snapshot, first, ["id"], pc.field("id") > 1)
    with pytest.raises(Exception, match="nope"):
        engine.read_arrow(snapshot, columns=["id", "nope"])


@layouts((), ALL_PARTITIONS)
def test_append_rows_added_appends_exactly_those_rows_once(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    source, target = str(tmp_path / "silver"), str(tmp_path / "gold")
    engine.create_table(source, SCHEMA, partition_by)
    for rows in (AWKWARD_ROWS[:3], AWKWARD_ROWS[3:5], AWKWARD_ROWS[5:]):
        engine.append(source, spark.createDataFrame(rows, SCHEMA))
    expected = engine.rows_added(source, 1, 3, (2,)).drop("_commit_version").collect()
    txn = AppTransaction("publish.t", 3)
    in_memory = engine.rows_added_arrow(source, 1, 3, (2,))
    assert in_memory.column_names == SCHEMA.fieldNames()
    assert_same_multiset(naive([tuple(r.values()) for r in in_memory.to_pylist()]), expected)
    assert engine.rows_added_arrow(source, 3, 3).num_rows == 0

    first = engine.append_rows_added(source, 1, 3, target, txn, (2,), partition_by)
    assert first.committed and first.rows_added == 2
    assert engine.snapshot(target).partition_columns == partition_by
    assert_same_multiset(engine.read(target), naive(AWKWARD_ROWS[5:]))
    assert_same_multiset(engine.read(target), expected)
    again = engine.append_rows_added(source, 1, 3, target, txn, (2,), partition_by)
    assert not again.committed  # the same app transaction: nothing appended twice
    assert engine.read(target).count() == 2

    # Vacuuming the source after an overwrite leaves the target's rows as they were.
    engine.overwrite(source, spark.createDataFrame([], SCHEMA))
    engine.vacuum(source, retention_hours=0)
    assert engine.read(source).count() == 0
    assert_same_multiset(engine.read(target), naive(AWKWARD_ROWS[5:]))


@layouts((), ALL_PARTITIONS)
def test_arrow_rows_append_and_overwrite_once_like_a_dataframe(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    """Arrow rows the driver holds land as a DataFrame's would: the same rows, partition
    values and statistics as the same rows appended from Spark, once per app transaction,
    and an overwrite replaces everything."""
    by_arrow, by_frame = str(tmp_path / "arrow"), str(tmp_path / "frame")
    rows = spark.createDataFrame(AWKWARD_ROWS, SCHEMA)
    first = engine.append(by_arrow, rows.toArrow(), AppTransaction("t", 1), partition_by)
    assert first.committed and first.rows_added == len(AWKWARD_ROWS)
    assert not engine.append(by_arrow, rows.toArrow(), AppTransaction("t", 1)).committed
    engine.append(by_frame, rows, partition_by=partition_by)
    assert_same_multiset(engine.read(by_arrow), naive(AWKWARD_ROWS))

    def partitions(path: str) -> dict[str, int]:
        """Rows per partition (as the log types their values), from the files' statistics."""
        rows: dict[str, int] = {}
        for f in engine.snapshot(path).files:
            key = str(sorted(f.partition_values.items()))
            rows[key] = rows.get(key, 0) + (f.num_records or 0)
        return rows

    assert engine.snapshot(by_arrow).partition_columns == partition_by
    assert partitions(by_arrow) == partitions(by_frame)
    ids = {r[0] for r in AWKWARD_ROWS}
    for f in engine.snapshot(by_arrow).files:  # statistics were written for every file
        assert f.bounds["id"][0] in ids and f.bounds["id"][1] in ids, f
    replacement = spark.createDataFrame(LABELS, SCHEMA).toArrow()
    assert engine.overwrite(by_arrow, replacement, AppTransaction("t", 2)).committed
    assert_same_multiset(engine.read(by_arrow), LABELS)
    assert engine.overwrite(by_arrow, replacement.slice(0, 0)).committed
    assert engine.read(by_arrow).count() == 0


def test_append_rows_appends_driver_rows_once(engine: DeltaEngine, tmp_path: Path) -> None:
    path = str(tmp_path / "results")
    engine.create_table(path, SCHEMA)
    txn = AppTransaction("quality.t", 7)
    assert engine.append_rows(path, AWKWARD_ROWS, SCHEMA, txn).rows_added == len(AWKWARD_ROWS)
    assert not engine.append_rows(path, AWKWARD_ROWS, SCHEMA, txn).committed
    assert_same_multiset(engine.read(path), naive(AWKWARD_ROWS))
    counted = sum(f.num_records or 0 for f in engine.snapshot(path).files)
    assert counted == len(AWKWARD_ROWS)  # the statistics were written
    other = T.StructType([*SCHEMA.fields, T.StructField("extra", T.LongType())])
    with pytest.raises(SchemaMismatchError):
        engine.append_rows(path, [(*AWKWARD_ROWS[0], 1)], other)


def test_snapshot_of_a_version_is_read_once_and_a_new_table_at_the_path_is_seen(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    """A version's snapshot is kept (its log is not read again), the latest version is
    always looked up (another writer's commit is seen), and a table deleted and created
    again at the same path is read afresh, not served from what was kept."""
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    engine.append(path, spark.createDataFrame(LABELS, SCHEMA))
    first = engine.snapshot(path, 1)
    assert engine.snapshot(path, 1) is first

    schema = pa.schema(DeltaTable(path).schema().to_arrow())
    row = {"id": [3], "label": ["c"], "day": [None], "at": [None], "amount": [3.0]}
    write_deltalake(path, pa.table(row).cast(schema), mode="append")
    assert engine.snapshot(path).version == 2  # another writer's commit
    assert_same_multiset(
        engine.read_files(engine.snapshot(path)), [*LABELS, (3, "c", None, None, 3.0)]
    )

    shutil.rmtree(path)
    other = T.StructType([T.StructField("name", T.StringType())])
    engine.create_table(path, other)
    engine.append(path, spark.createDataFrame([("x",)], other))
    again = engine.snapshot(path, 1)
    assert again.schema == other and again is not first
    assert_same_multiset(engine.read_files(again), [("x",)])


def test_embedded_adds_the_source_files_themselves_where_partitioning_matches(
    spark: SparkSession, embedded: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    source, linked, rewritten = (str(tmp_path / n) for n in ("silver", "gold", "flat"))
    embedded.create_table(source, SCHEMA, ("label",))
    embedded.append(source, spark.createDataFrame(LABELS, SCHEMA))
    embedded.append_rows_added(source, 0, 1, linked, AppTransaction("p", 1), (), ("label",))
    for file in embedded.snapshot(linked).files:
        assert os.stat(file.path).st_nlink == 2, file.path  # the silver file's second name
    # A target partitioned otherwise gets the rows rewritten into its own layout.
    embedded.create_table(rewritten, SCHEMA, ())
    embedded.append_rows_added(source, 0, 1, rewritten, AppTransaction("p", 1))
    assert_same_multiset(embedded.read(rewritten), LABELS)
    assert all(os.stat(f.path).st_nlink == 1 for f in embedded.snapshot(rewritten).files)
    with pytest.raises(SchemaMismatchError):
        other = T.StructType([*SCHEMA.fields, T.StructField("extra", T.LongType())])
        embedded.create_table(str(tmp_path / "other"), other, ("label",))
        embedded.append_rows_added(source, 0, 1, str(tmp_path / "other"))


def test_arrow_schema_of_created_table_uses_utc_microseconds(
    engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    arrow = pa.schema(DeltaTable(path).schema().to_arrow())
    assert arrow.field("at").type == pa.timestamp("us", tz="UTC")
    assert engine.create_table(path, SCHEMA) == 0  # the same definition is accepted
    with pytest.raises(DeltaTableError, match="partitioned by"):
        engine.create_table(path, SCHEMA, ("label",))


def test_append_with_partition_columns_creates_a_missing_table(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "made")
    rows = spark.createDataFrame(LABELS, SCHEMA)
    first = engine.append(path, rows, partition_by=("label",))
    assert first.committed and engine.snapshot(path).partition_columns == ("label",)
    engine.append(path, rows, partition_by=("label",))  # the same definition: appended
    assert_same_multiset(engine.read(path), LABELS + LABELS)
    with pytest.raises(DeltaTableError, match="partitioned by"):
        engine.append(path, rows, partition_by=())
    with pytest.raises(TableNotFoundError, match="no Delta table"):
        engine.append(str(tmp_path / "not-made"), rows)  # without partition_by: must exist
    assert not engine.exists(str(tmp_path / "not-made"))


def test_missing_table_is_a_clear_error(engine: DeltaEngine, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    assert not engine.exists(missing)
    with pytest.raises(TableNotFoundError, match="no Delta table"):
        engine.snapshot(missing)
    with pytest.raises(TableNotFoundError, match="no Delta table"):
        engine.read(missing)


# ---------------------------------------------------------------------- commits


WRITES = ("append", "replace", "overwrite", "delete_partitions", "merge")
# The rows each write of REPLACEMENT (replace and delete_partitions: label = 'a') leaves in a
# table that held LABELS.
AFTER_WRITE = {
    "append": LABELS + REPLACEMENT,
    "replace": [LABELS[1], *REPLACEMENT],
    "overwrite": REPLACEMENT,
    "delete_partitions": [LABELS[1]],
    "merge": LABELS + REPLACEMENT,
}


def labelled_table_write(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> tuple[str, Callable[[str, AppTransaction | None], Any]]:
    """A table of LABELS partitioned by label, and a call of each write of REPLACEMENT to it
    by name, with an app transaction or none."""
    path = labelled_table(spark, engine, tmp_path)
    data = spark.createDataFrame(REPLACEMENT, SCHEMA)
    where = [PartitionFilter("label", "=", "a")]

    def write(operation: str, txn: AppTransaction | None = None) -> Any:
        writes: dict[str, Callable[[], Any]] = {
            "append": lambda: engine.append(path, data, txn),
            "replace": lambda: engine.replace(path, data, where, txn),
            "overwrite": lambda: engine.overwrite(path, data, txn),
            "delete_partitions": lambda: engine.delete_partitions(path, where, txn),
            "merge": lambda: engine.merge(path, data, ["id"], txn=txn),
        }
        return writes[operation]()

    return path, write


@pytest.mark.parametrize("operation", WRITES)
def test_app_transaction_commits_once(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, operation: str
) -> None:
    path, write = labelled_table_write(spark, engine, tmp_path)
    expected = AFTER_WRITE[operation]
    txn = AppTransaction("pipeline.stage", 7)

    first = write(operation, txn)
    again = write(operation, txn)
    older = write(operation, AppTransaction("pipeline.stage", 3))

    assert first.committed and first.table_version == 2
    assert not again.committed and not older.committed
    assert again.table_version == older.table_version == 2
    assert engine.transaction_version(path, "pipeline.stage") == 7
    assert engine.transaction_version(path, "other") is None
    assert engine.snapshot(path).version == 2
    assert_same_multiset(engine.read(path), expected)


class LeaseLostError(Exception):
    """What the pipeline's lease fencing check raises in production."""


@pytest.mark.parametrize("operation", WRITES)
def test_commit_guard_runs_before_every_commit_and_can_stop_it(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path, operation: str
) -> None:
    path, write = labelled_table_write(spark, engine, tmp_path)

    def lost() -> None:
        raise LeaseLostError("pipeline lease t lost to run r2")

    engine.commit_guard = lost
    with pytest.raises(LeaseLostError, match="lease t lost"):
        write(operation)
    assert engine.snapshot(path).version == 1
    assert_same_multiset(engine.read(path), LABELS)

    calls: list[int] = []
    engine.commit_guard = lambda: calls.append(engine.snapshot(path).version)
    write(operation)
    assert calls == [1]
    assert engine.snapshot(path).version == 2
    assert_same_multiset(engine.read(path), AFTER_WRITE[operation])


def test_commit_info_carries_a_commit_id_and_the_commit_metadata(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    engine.commit_metadata = {"runId": "run-42"}
    data = spark.createDataFrame(AWKWARD_ROWS[:2], SCHEMA)
    engine.append(path, data, AppTransaction("app", 1))
    engine.replace(path, data.where("label = 'a b'"), [PartitionFilter("label", "=", "a b")])

    latest, first = engine.history(path, 2)
    assert (latest["version"], first["version"]) == (2, 1)
    assert latest["runId"] == first["runId"] == "run-42"
    assert latest[COMMIT_ID_KEY] and first[COMMIT_ID_KEY]
    assert latest[COMMIT_ID_KEY] != first[COMMIT_ID_KEY]
    assert isinstance(latest["timestamp"], int) and latest["timestamp"] >= first["timestamp"]
    # A range's commit information is the history's entries of those versions, oldest first.
    infos = engine.commit_infos(path, 0, 2)
    assert [v for v, _ in infos] == [1, 2]
    assert [(i[COMMIT_ID_KEY], i["runId"]) for _, i in infos] == [
        (first[COMMIT_ID_KEY], "run-42"),
        (latest[COMMIT_ID_KEY], "run-42"),
    ]
    assert [v for v, _ in engine.commit_infos(path, 1, 2)] == [2]
    assert engine.commit_infos(path, 2, 2) == []

    engine.commit_metadata = {COMMIT_ID_KEY: "mine"}
    with pytest.raises(ConfigError, match=re.escape(COMMIT_ID_KEY)):
        engine.append(path, data)
    assert engine.snapshot(path).version == 2


def test_schema_drift_append_is_refused_with_column_names(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    drifted = T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("label", T.StringType()),
            T.StructField("day", T.DateType()),
            T.StructField("amount", T.DoubleType()),
            T.StructField("extra", T.IntegerType()),
        ]
    )
    frame = spark.createDataFrame([("1", "a", None, 1.0, 1)], drifted)
    for write in (
        lambda: engine.append(path, frame),
        lambda: engine.overwrite(path, frame),
        lambda: engine.merge(path, frame, ["id"]),
    ):
        with pytest.raises(SchemaMismatchError) as info:
            write()
        message = str(info.value)
        assert "missing columns: at (timestamp)" in message
        assert "unexpected columns: extra (int)" in message
        assert "column id: table has bigint, data has string" in message
    assert engine.snapshot(path).version == 0


# ---------------------------------------------------------------------- concurrent writers


def test_replace_refuses_a_concurrent_append_into_its_partition_and_retries_clean(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = labelled_table(spark, engine, tmp_path)
    concurrent = [(3, "a", None, None, 3.0)]
    other = make_engine(spark, engine.name)
    where = [PartitionFilter("label", "=", "a")]
    gate = Gate(tmp_path / "gate")
    held = gate.hold(spark.createDataFrame(REPLACEMENT, SCHEMA))

    with pytest.raises(ConcurrentModificationError, match=r"label`? = 'a'.*version 1.*version 2"):
        gate.run(
            lambda: engine.replace(path, held, where, AppTransaction("backfill", 1)),
            lambda: other.append(path, spark.createDataFrame(concurrent, SCHEMA)),
        )

    assert engine.snapshot(path).version == 2
    assert engine.transaction_version(path, "backfill") is None
    assert_same_multiset(engine.read(path), LABELS + concurrent)

    retry = engine.replace(
        path, spark.createDataFrame(REPLACEMENT, SCHEMA), where, AppTransaction("backfill", 1)
    )
    assert retry.committed and retry.table_version == 3
    assert_same_multiset(engine.read(path), [LABELS[1], *REPLACEMENT])


def test_replace_commits_over_a_concurrent_append_into_another_partition(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = labelled_table(spark, engine, tmp_path)
    concurrent = [(3, "b", None, None, 3.0), (4, "c", None, None, 4.0)]
    other = make_engine(spark, engine.name)
    gate = Gate(tmp_path / "gate")
    held = gate.hold(spark.createDataFrame(REPLACEMENT, SCHEMA))

    outcome = gate.run(
        lambda: engine.replace(path, held, [PartitionFilter("label", "=", "a")]),
        lambda: other.append(path, spark.createDataFrame(concurrent, SCHEMA)),
    )

    assert outcome.committed and outcome.table_version == 3
    assert outcome.rows_added == len(REPLACEMENT)
    assert_same_multiset(engine.read(path), [LABELS[1], *concurrent, *REPLACEMENT])


def test_overwrite_refuses_a_concurrent_append_anywhere(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = labelled_table(spark, engine, tmp_path)
    concurrent = [(3, "c", None, None, 3.0)]
    other = make_engine(spark, engine.name)
    gate = Gate(tmp_path / "gate")
    held = gate.hold(spark.createDataFrame(REPLACEMENT, SCHEMA))

    with pytest.raises(ConcurrentModificationError, match="overwrite"):
        gate.run(
            lambda: engine.overwrite(path, held),
            lambda: other.append(path, spark.createDataFrame(concurrent, SCHEMA)),
        )
    assert engine.snapshot(path).version == 2
    assert_same_multiset(engine.read(path), LABELS + concurrent)


def test_commit_lost_to_another_writer_of_the_same_app_transaction_is_not_ours(
    spark: SparkSession, engine: DeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    ours, theirs = AWKWARD_ROWS[:2], AWKWARD_ROWS[2:5]
    other = make_engine(spark, engine.name)
    txn = AppTransaction("pipeline.stage", 1)
    gate = Gate(tmp_path / "gate")
    held = gate.hold(spark.createDataFrame(ours, SCHEMA))

    # Both writers checked the table before either committed; the other one lands first.
    outcome = gate.run(
        lambda: engine.append(path, held, txn),
        lambda: other.append(path, spark.createDataFrame(theirs, SCHEMA), txn),
    )

    assert not outcome.committed
    assert outcome.table_version == 1
    assert engine.transaction_version(path, "pipeline.stage") == 1
    assert engine.snapshot(path).version == 1
    assert_same_multiset(engine.read(path), naive(theirs))


# ---------------------------------------------------------------------- engine choice


def test_engine_choice(spark: SparkSession) -> None:
    assert open_engine(spark, "embedded").name == "embedded"
    # The tests' session always has the delta-spark jars; auto still picks the embedded
    # engine, whose commits and snapshots are the cheaper ones (factory's docstring).
    assert open_engine(spark, "auto").name == "embedded"
    assert open_engine(spark, "native").name == "native"
    with pytest.raises(ConfigError, match="must be auto, embedded or native"):
        open_engine(spark, "turbo")  # type: ignore[arg-type]


CHOICE_WITHOUT_JARS = """
from common.errors import ConfigError
from warehouse.delta import open_engine
from warehouse.spark import SparkSettings, build_session, has_delta_jars
spark = build_session(SparkSettings(app_name="no-jars", master="local[1]"))
print("jars", has_delta_jars(spark))
print("auto", open_engine(spark, "auto").name)
try:
    open_engine(spark, "native")
except ConfigError as e:
    print("native refused:", e)
"""


@pytest.mark.slow
def test_engine_choice_without_the_jars_is_embedded_and_native_is_refused() -> None:
    run = subprocess.run(
        [sys.executable, "-c", CHOICE_WITHOUT_JARS],
        check=False,
        cwd=REPO_ROOT,
        env={**os.environ, DELTA_JARS_ENV: ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[:2] == ["jars False", "auto embedded"]
    assert lines[2].startswith("native refused:") and "not on the Spark classpath" in lines[2]


# ---------------------------------------------------------------------- embedded engine internals


def _around_first_commit(
    monkeypatch: pytest.MonkeyPatch,
    before: Callable[[], object] = lambda: None,
    after: Callable[[], object] = lambda: None,
    mode: str | None = None,
) -> None:
    """Run ``before`` and ``after`` around the first delta-rs commit call (of ``mode``).

    ``before`` is the latest a concurrent writer can land before this commit: after the
    data files are written and the removes chosen, before the log entry is written;
    ``after``, the first moment after it landed.
    """
    real_commit = DeltaTable.create_write_transaction
    done = False

    def commit(self: DeltaTable, actions: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal done
        first = not done and (mode is None or kwargs.get("mode") == mode)
        done = done or first
        if first:
            before()
        real_commit(self, actions, *args, **kwargs)
        if first:
            after()

    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit)


def test_error_after_commit_landed_is_not_retried_into_a_duplicate(
    spark: SparkSession,
    through_delta_rs: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """delta-rs can raise after its commit landed (a post-commit checkpoint hook)."""
    path = str(tmp_path / "t")
    through_delta_rs.create_table(path, SCHEMA)
    data = spark.createDataFrame(AWKWARD_ROWS[:3], SCHEMA)

    def fail() -> None:
        raise OSError("post-commit checkpoint failed")

    _around_first_commit(monkeypatch, after=fail)
    first = through_delta_rs.append(path, data, AppTransaction("app", 1))
    assert first.committed
    monkeypatch.undo()
    retry = through_delta_rs.append(path, data, AppTransaction("app", 1))
    assert not retry.committed
    assert_same_multiset(through_delta_rs.read(path), naive(AWKWARD_ROWS[:3]))


def test_error_before_commit_raises_commit_error(
    spark: SparkSession,
    through_delta_rs: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(tmp_path / "t")
    through_delta_rs.create_table(path, SCHEMA)

    def fail(self: DeltaTable, *args: object, **kwargs: object) -> None:
        raise OSError("storage unavailable")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", fail)
    with pytest.raises(CommitError, match="did not land"):
        through_delta_rs.append(
            path, spark.createDataFrame(AWKWARD_ROWS[:1], SCHEMA), AppTransaction("app", 1)
        )
    monkeypatch.undo()
    assert through_delta_rs.read(path).count() == 0


def test_outcome_reports_the_version_of_our_commit_not_a_later_one(
    spark: SparkSession,
    through_delta_rs: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(tmp_path / "t")
    through_delta_rs.create_table(path, SCHEMA)
    other = EmbeddedDeltaEngine(spark)
    _around_first_commit(
        monkeypatch,
        after=lambda: other.append(path, spark.createDataFrame(AWKWARD_ROWS[3:], SCHEMA)),
    )
    outcome = through_delta_rs.append(path, spark.createDataFrame(AWKWARD_ROWS[:3], SCHEMA))

    assert outcome.committed and outcome.table_version == 1
    assert outcome.rows_added == 3 and outcome.files_added >= 1
    assert through_delta_rs.snapshot(path).version == 2
    assert_same_multiset(through_delta_rs.read(path), naive(AWKWARD_ROWS))


@pytest.mark.parametrize(
    ("concurrent_label", "conflicts"),
    [("a", True), ("c", False)],
)
def test_delete_partitions_checks_commits_made_inside_its_commit_call(
    spark: SparkSession,
    through_delta_rs: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    concurrent_label: str,
    conflicts: bool,
) -> None:
    """delete_partitions writes no data, so no Gate can hold it: the concurrent commit is
    made inside delta-rs's commit call instead (delta-spark has no such seam)."""
    path = str(tmp_path / "t")
    through_delta_rs.create_table(path, SCHEMA, ("label",))
    through_delta_rs.append(path, spark.createDataFrame(LABELS, SCHEMA))
    concurrent = [(3, concurrent_label, None, None, 3.0)]
    other = EmbeddedDeltaEngine(spark)
    _around_first_commit(
        monkeypatch,
        before=lambda: other.append(path, spark.createDataFrame(concurrent, SCHEMA)),
        mode="overwrite",
    )
    where = [PartitionFilter("label", "=", "a")]
    if conflicts:
        with pytest.raises(ConcurrentModificationError, match="delete_partitions"):
            through_delta_rs.delete_partitions(path, where)
        assert through_delta_rs.snapshot(path).version == 2
        assert_same_multiset(through_delta_rs.read(path), LABELS + concurrent)
    else:
        through_delta_rs.delete_partitions(path, where)
        assert through_delta_rs.snapshot(path).version == 3
        assert_same_multiset(through_delta_rs.read(path), [LABELS[1], *concurrent])


def test_reserved_commit_info_keys_are_refused(
    spark: SparkSession, embedded: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    embedded.create_table(path, SCHEMA)
    embedded.commit_metadata = {"operation": "mine"}
    with pytest.raises(ConfigError, match="reserved commitInfo keys"):
        embedded.append(path, spark.createDataFrame(AWKWARD_ROWS[:1], SCHEMA))
    assert embedded.snapshot(path).version == 0


def _hand_written_table(root: Path, protocol: dict, configuration: dict) -> str:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    mapped = "delta.columnMapping.mode" in configuration
    field_metadata = (
        {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-1"} if mapped else {}
    )
    schema = {
        "type": "struct",
        "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": field_metadata}],
    }
    actions = [
        {"protocol": protocol},
        {
            "metaData": {
                "id": "fixture",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": configuration,
                "createdTime": 0,
            }
        },
    ]
    (log / "00000000000000000000.json").write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    return str(root)


@pytest.mark.parametrize(
    ("protocol", "configuration", "feature"),
    [
        (
            {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["deletionVectors"],
                "writerFeatures": ["deletionVectors"],
            },
            {"delta.enableDeletionVectors": "true"},
            "deletionVectors",
        ),
        (
            {"minReaderVersion": 2, "minWriterVersion": 5},
            {"delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "1"},
            "columnMapping",
        ),
        (
            {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": ["typeWidening"],
                "writerFeatures": ["typeWidening"],
            },
            {},
            "typeWidening",
        ),
    ],
)
def test_embedded_refuses_reader_features_it_cannot_honour(
    embedded: EmbeddedDeltaEngine, tmp_path: Path, protocol: dict, configuration: dict, feature: str
) -> None:
    path = _hand_written_table(tmp_path / "t", protocol, configuration)
    with pytest.raises(UnsupportedTableFeatureError) as info:
        embedded.read(path)
    message = str(info.value)
    assert f"['{feature}']" in message and "embedded engine cannot read" in message
    assert "the native engine (delta-spark" in message


def test_embedded_reads_tables_whose_reader_features_are_safe(
    embedded: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["timestampNtz"],
        "writerFeatures": ["timestampNtz"],
    }
    path = _hand_written_table(tmp_path / "t", protocol, {})
    assert embedded.read(path).count() == 0


def test_a_held_handle_is_not_served_after_another_writer_or_a_recreated_table(
    spark: SparkSession, embedded: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    """The embedded engine holds each table's latest handle between calls: a commit by
    another writer, the engine's own commits, and a table deleted and created again at the
    path must each be seen as a fresh open would see them."""
    path = str(tmp_path / "t")
    embedded.create_table(path, SCHEMA)
    embedded.append(path, spark.createDataFrame(AWKWARD_ROWS[:2], SCHEMA))
    assert [h["version"] for h in embedded.history(path)] == [1, 0]  # now held at 1
    other = EmbeddedDeltaEngine(spark)
    other.append(path, spark.createDataFrame(AWKWARD_ROWS[2:4], SCHEMA))
    assert [h["version"] for h in embedded.history(path)] == [2, 1, 0]
    embedded.append(path, spark.createDataFrame(AWKWARD_ROWS[4:], SCHEMA))
    assert embedded.snapshot(path).version == 3
    assert_same_multiset(embedded.read(path), naive(AWKWARD_ROWS))
    shutil.rmtree(tmp_path / "t")
    other.create_table(path, SCHEMA)
    other.append(path, spark.createDataFrame(AWKWARD_ROWS[:1], SCHEMA))
    other.append(path, spark.createDataFrame(AWKWARD_ROWS[1:2], SCHEMA))
    other.append(path, spark.createDataFrame(AWKWARD_ROWS[2:3], SCHEMA))  # version 3 again
    assert len(embedded.history(path)) == 4
    assert_same_multiset(embedded.read(path), naive(AWKWARD_ROWS[:3]))


def _described(engine: EmbeddedDeltaEngine, path: str) -> list[tuple[Any, ...]]:
    """A snapshot's live files as a comparison sees them, log paths included."""
    return sorted(
        (f.path, f.log_path, f.num_records, tuple(sorted(f.partition_values.items())))
        for f in engine.snapshot(path).files
    )


def _engine_info(path: str, version: int) -> str:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as handle:
        infos = [json.loads(line)["commitInfo"] for line in handle if '"commitInfo"' in line]
    return str(infos[0].get("engineInfo"))


INT_SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("segment", T.LongType()),
        T.StructField("label", T.StringType()),
    ]
)


def test_the_engine_writes_its_own_commit_files_and_every_reader_reads_them(
    spark: SparkSession,
    embedded: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Appends, a replace of some partitions, a delete of one and an overwrite are
    committed by writing their commit files (no delta-rs commit, no table opened after
    the first look), and a fresh engine, delta-rs and the log agree with the engine on
    every version: rows, live files with their log paths, and app transactions."""
    path = str(tmp_path / "t")
    embedded.create_table(path, INT_SCHEMA, ("segment", "label"))
    first = [(1, 0, "a b"), (2, 1, "x/y:z%"), (3, 2, None), (4, 2, "é ü %20")]

    def rows(data: list[tuple]) -> pa.Table:
        return spark.createDataFrame(data, INT_SCHEMA).toArrow()

    embedded.append(path, rows(first), AppTransaction("app", 1))
    opened: list[int | None] = []
    open_table = embedded._tips.open_table

    def counted(root: str, version: int | None = None) -> Any:
        opened.append(version)
        return open_table(root, version)

    monkeypatch.setattr(embedded._tips, "open_table", counted)
    embedded.append(path, rows([(5, 1, "x/y:z%"), (6, 3, "a b")]), AppTransaction("app", 2))
    embedded.replace(
        path, rows([(7, 1, "new"), (8, 2, None)]), [PartitionFilter("segment", "in", [1, 2])]
    )
    embedded.delete_partitions(path, [PartitionFilter("label", "=", "a b")])
    expected = [(7, 1, "new"), (8, 2, None)]
    assert embedded.snapshot(path).version == 4
    assert_same_multiset(embedded.read(path), expected)
    # Only the replace's scope was listed (once, at the version it replaced against).
    assert opened == [2]
    assert all(_engine_info(path, v) == "enrichment-log-writer" for v in (2, 3, 4))
    fresh = EmbeddedDeltaEngine(spark)
    assert _described(embedded, path) == _described(fresh, path)
    for version, wanted in [
        (1, first),
        (2, [*first, (5, 1, "x/y:z%"), (6, 3, "a b")]),
        (4, expected),
    ]:
        assert_same_multiset(fresh.read(path, version=version), wanted)
        delta_rs = DeltaTable(path, version=version).to_pyarrow_table().to_pylist()
        assert sorted((r["id"], r["segment"], r["label"]) for r in delta_rs) == sorted(wanted)
    assert (
        DeltaTable(path).transaction_version("app")
        == 2
        == embedded.transaction_version(path, "app")
    )
    assert not embedded.append(path, rows([(9, 0, "z")]), AppTransaction("app", 2)).committed
    embedded.overwrite(path, rows([(10, 5, "w")]))
    assert_same_multiset(fresh.read(path), [(10, 5, "w")])
    assert [h["version"] for h in DeltaTable(path).history()][:1] == [5]


def test_a_commit_file_version_lost_to_another_writer_commits_through_delta_rs(
    spark: SparkSession,
    embedded: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another writer commits between the tip this engine read and its commit file: the
    file is not written over the other's, and delta-rs commits on the next version (an
    append), or the replace is refused when the other commit touched its partitions."""
    import warehouse.delta.embedded_commits as embedded_commits

    path = str(tmp_path / "t")
    embedded.create_table(path, SCHEMA, ("label",))
    embedded.append(path, spark.createDataFrame(LABELS, SCHEMA))
    other = EmbeddedDeltaEngine(spark)
    real = embedded_commits.write_commit
    concurrent: list[list[tuple]] = []

    def another_writer_first(root: str, version: int, actions: Any) -> bool:
        if concurrent:
            other.append(path, spark.createDataFrame(concurrent.pop(), SCHEMA))
        return real(root, version, actions)

    monkeypatch.setattr(embedded_commits, "write_commit", another_writer_first)
    concurrent.append([(3, "c", None, None, 3.0)])
    outcome = embedded.append(path, spark.createDataFrame(REPLACEMENT, SCHEMA))
    assert outcome.table_version == 3 and _engine_info(path, 2) == "enrichment-log-writer"
    assert _engine_info(path, 3) != "enrichment-log-writer"  # delta-rs's commit
    assert_same_multiset(embedded.read(path), [*LABELS, (3, "c", None, None, 3.0), *REPLACEMENT])

    concurrent.append([(4, "a", None, None, 4.0)])
    with pytest.raises(ConcurrentModificationError, match="replace"):
        embedded.replace(
            path,
            spark.createDataFrame([(5, "a", None, None, 5.0)], SCHEMA),
            [PartitionFilter("label", "=", "a")],
        )
    concurrent.append([(6, "d", None, None, 6.0)])
    embedded.replace(
        path,
        spark.createDataFrame([(7, "b", None, None, 7.0)], SCHEMA),
        [PartitionFilter("label", "=", "b")],
    )
    assert_same_multiset(
        EmbeddedDeltaEngine(spark).read(path),
        [
            LABELS[0],
            (3, "c", None, None, 3.0),
            *REPLACEMENT,
            (4, "a", None, None, 4.0),
            (6, "d", None, None, 6.0),
            (7, "b", None, None, 7.0),
        ],
    )


def test_the_log_writer_checkpoints_at_the_tables_interval(
    spark: SparkSession, embedded: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    embedded.create_table(path, INT_SCHEMA, ("segment",), {"delta.checkpointInterval": "3"})
    for i in range(7):
        embedded.append(path, spark.createDataFrame([(i, i % 2, "x")], INT_SCHEMA).toArrow())
    log = sorted(os.listdir(os.path.join(path, "_delta_log")))
    assert [f for f in log if f.endswith(".checkpoint.parquet")] == [
        f"{v:020d}.checkpoint.parquet"
        for v in (2, 5)  # delta-rs's cadence
    ]
    assert not [f for f in log if f.endswith(".tmp")]
    assert DeltaTable(path).version() == 7
    assert sorted(r["id"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()) == list(
        range(7)
    )


@pytest.mark.parametrize(
    "properties", [{"delta.enableChangeDataFeed": "true"}, {"delta.appendOnly": "true"}]
)
def test_tables_the_log_writer_may_not_write_are_committed_by_delta_rs(
    spark: SparkSession,
    embedded: EmbeddedDeltaEngine,
    tmp_path: Path,
    properties: dict[str, str],
) -> None:
    """A change-data-feed table (writer version 4) is committed by delta-rs; so is a
    replace of an append-only table, which delta-rs refuses."""
    path = str(tmp_path / "t")
    embedded.create_table(path, SCHEMA, ("label",), properties)
    embedded.append(path, spark.createDataFrame(LABELS, SCHEMA))
    if "delta.appendOnly" in properties:
        assert _engine_info(path, 1) == "enrichment-log-writer"  # an append is allowed
        with pytest.raises((CommitError, DeltaTableError)):
            embedded.replace(
                path,
                spark.createDataFrame(REPLACEMENT, SCHEMA),
                [PartitionFilter("label", "=", "a")],
            )
        assert_same_multiset(embedded.read(path), LABELS)
    else:
        assert _engine_info(path, 1) != "enrichment-log-writer"
        assert_same_multiset(embedded.read(path), LABELS)


def test_an_error_after_the_commit_file_landed_is_not_committed_again(
    spark: SparkSession,
    embedded: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The commit file became visible but the call raised (a network file system retrying
    its link): the version carries this commit's id, so it is reported as ours and not
    committed a second time through delta-rs."""
    import warehouse.delta.embedded_commits as embedded_commits

    path = str(tmp_path / "t")
    embedded.create_table(path, SCHEMA)
    real = embedded_commits.write_commit

    def landed_then_failed(root: str, version: int, actions: Any) -> bool:
        real(root, version, actions)
        raise OSError("link reported an error after it was made")

    monkeypatch.setattr(embedded_commits, "write_commit", landed_then_failed)
    outcome = embedded.append(path, spark.createDataFrame(LABELS, SCHEMA))
    assert outcome.committed and outcome.table_version == 1
    assert DeltaTable(path).version() == 1
    assert_same_multiset(embedded.read(path), LABELS)


def test_a_replace_of_the_empty_string_selects_the_same_files_on_either_commit_path(
    spark: SparkSession,
    embedded: EmbeddedDeltaEngine,
    through_delta_rs: EmbeddedDeltaEngine,
    tmp_path: Path,
) -> None:
    """delta-rs reads a partition value "" as null; the engine's own commits leave such a
    predicate to delta-rs, so both paths remove the same files."""
    rows = [*LABELS, (3, None, None, None, 3.0)]
    results = []
    for name, engine in (("own", embedded), ("delta-rs", through_delta_rs)):
        path = str(tmp_path / name)
        engine.create_table(path, SCHEMA, ("label",))
        engine.append(path, spark.createDataFrame(rows, SCHEMA))
        engine.delete_partitions(path, [PartitionFilter("label", "=", "")])
        engine.delete_partitions(path, [PartitionFilter("label", "in", ["b"])])
        results.append(sorted(r[0] for r in engine.read(path).collect()))
    assert results[0] == results[1]
