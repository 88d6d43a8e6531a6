"""A version's files replayed from an earlier version and the commits in between equal the
files delta-spark's full state gives, and what the replay does not model falls back."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from warehouse.delta import AppTransaction, PartitionFilter, Snapshot, open_engine
from warehouse.delta.api import DataFile
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.delta.log_replay import replay
from warehouse.delta.native import NativeDeltaEngine

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("label", T.StringType()),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("n", T.IntegerType()),
    ]
)
ROWS = [
    (1, "a b", dt.date(2024, 1, 1), dt.datetime(2024, 1, 1, 10), 1),
    (2, "x/y:z%", dt.date(2024, 1, 2), dt.datetime(2024, 1, 1, 10, 0, 0, 123456), 2),
    (3, None, None, None, None),
    (4, "é ü %20", dt.date(1999, 12, 31), dt.datetime(1999, 12, 31, 23, 59, 59), -3),
]
IDENTITY = {c: c for c in SCHEMA.fieldNames()}


def add(path: str, label: str | None = "a", records: int = 2) -> str:
    stats = {"numRecords": records, "minValues": {"id": 1}, "maxValues": {"id": 9}}
    body = {
        "path": path,
        "size": 100,
        "partitionValues": {"label": label},
        "stats": json.dumps(stats),
        "dataChange": True,
    }
    return json.dumps({"add": body})


def remove(path: str) -> str:
    return json.dumps({"remove": {"path": path, "dataChange": True}})


def replayed(live: dict[str, DataFile], *commits: list[str]) -> dict[str, DataFile] | None:
    texts = ["\n".join(lines) for lines in commits]
    return replay("/t", live, texts, SCHEMA, ("label",), IDENTITY)


def test_adds_and_removes_apply_in_order_and_other_actions_change_nothing() -> None:
    files = replayed(
        {},
        [add("label=a/1.parquet"), json.dumps({"commitInfo": {"operation": "WRITE"}})],
        [
            remove("label=a/1.parquet"),
            add("label=a/2.parquet", records=5),
            json.dumps({"txn": {"appId": "x", "version": 3}}),
        ],
        [add("label=__HIVE_DEFAULT_PARTITION__/3.parquet", label=None)],
    )
    assert files is not None
    assert sorted(files) == ["label=__HIVE_DEFAULT_PARTITION__/3.parquet", "label=a/2.parquet"]
    second = files["label=a/2.parquet"]
    assert second.path == "/t/label=a/2.parquet"
    assert (second.num_records, second.size_bytes, second.partition_values) == (
        5,
        100,
        {"label": "a"},
    )
    assert second.bounds["id"] == (1, 9)
    assert files["label=__HIVE_DEFAULT_PARTITION__/3.parquet"].partition_values == {"label": None}


@pytest.mark.parametrize(
    "action",
    [
        json.dumps({"metaData": {"id": "x"}}),
        json.dumps({"protocol": {"minReaderVersion": 3}}),
        json.dumps({"add": {"path": "p", "size": 1, "deletionVector": {"cardinality": 1}}}),
        remove("never-added.parquet"),
        json.dumps({"somethingNew": {}}),
    ],
)
def test_what_the_replay_does_not_model_gives_none(action: str) -> None:
    assert replayed({}, [add("label=a/1.parquet")], [action]) is None


def test_an_empty_partition_value_is_null_as_the_engines_read_it() -> None:
    files = replayed({}, [add("label=__HIVE_DEFAULT_PARTITION__/e.parquet", label="")])
    assert files is not None
    assert files["label=__HIVE_DEFAULT_PARTITION__/e.parquet"].partition_values == {"label": None}
    dated = T.StructType([T.StructField("day", T.DateType())])
    body = {"path": "p", "size": 1, "partitionValues": {"day": ""}}
    typed = replay("/t", {}, [json.dumps({"add": body})], dated, ("day",), {"day": "day"})
    assert typed is not None and typed["p"].partition_values == {"day": None}


def test_a_partition_value_spark_would_cast_otherwise_gives_none() -> None:
    timed = T.StructType([T.StructField("at", T.TimestampType())])
    body = {"path": "p", "size": 1, "partitionValues": {"at": "2024-01-01 10:00:00"}}
    assert replay("/t", {}, [json.dumps({"add": body})], timed, ("at",), {"at": "at"}) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=30))
def test_live_files_are_the_last_adds_not_removed_since(ops: list[tuple[bool, int]]) -> None:
    """Against a set model: every add makes its path live, every remove of a live path
    drops it, and a remove of a path that is not live is refused (None)."""
    live: set[str] = set()
    commits: list[list[str]] = []
    valid = True
    for adding, n in ops:
        path = f"label=a/{n}.parquet"
        if adding:
            live.add(path)
            commits.append([add(path)])
        else:
            valid = valid and path in live
            live.discard(path)
            commits.append([remove(path)])
    files = replayed({}, *commits)
    assert (files is None) == (not valid)
    if files is not None:
        assert set(files) == live


def described(snapshot: Snapshot) -> list[tuple[Any, ...]]:
    return sorted(
        (
            f.path,
            f.size_bytes,
            f.num_records,
            tuple(sorted(f.partition_values.items())),
            tuple(sorted(f.bounds.items())),
        )
        for f in snapshot.files
    )


@pytest.mark.parametrize("partition_by", [("label", "day"), ("at",)])
def test_native_snapshots_after_each_write_equal_delta_sparks_full_state(
    spark: SparkSession, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    """Every version a native engine saw its own writes make (replayed from the one before
    where the replay applies: string and date partitions; built in full for timestamp
    partitions) equals what a fresh engine builds from delta-spark's state."""
    engine = open_engine(spark, "native")
    assert isinstance(engine, NativeDeltaEngine)
    built: list[int] = []
    full_build = engine._built

    def counting(root: str, jsnap: Any) -> Any:
        built.append(int(jsnap.version()))
        return full_build(root, jsnap)

    engine._built = counting  # type: ignore[method-assign]
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, partition_by)
    writes = [
        lambda: engine.append(path, spark.createDataFrame(ROWS[:2], SCHEMA)),
        lambda: engine.append(
            path, spark.createDataFrame(ROWS[2:], SCHEMA), AppTransaction("a", 1)
        ),
        lambda: engine.merge(path, spark.createDataFrame([ROWS[0]], SCHEMA), ["id"]),
        lambda: engine.delete_partitions(path, [PartitionFilter(partition_by[0], "=", None)]),
        lambda: engine.overwrite(path, spark.createDataFrame(ROWS[1:3], SCHEMA)),
    ]
    seen = [engine.snapshot(path)]
    for write in writes:
        write()
        seen.append(engine.snapshot(path))
    fresh = open_engine(spark, "native")
    assert isinstance(fresh, NativeDeltaEngine)
    fresh._replayed = lambda *_: None  # type: ignore[method-assign]  # delta-spark's state only
    for snapshot in seen:
        assert described(snapshot) == described(fresh.snapshot(path, snapshot.version))
    assert [s.version for s in seen] == list(range(len(writes) + 1))
    if partition_by == ("at",):
        # Timestamps are Spark's to cast: every version that adds a file is built in full
        # (the delete adds none and is replayed).
        assert {1, 2, 3, 5} <= set(built)
    else:
        assert len(built) < len(seen)  # later versions replayed from the first


@pytest.mark.parametrize("partition_by", [("label", "day"), ("at",)])
def test_embedded_snapshots_and_file_actions_replayed_equal_delta_rs_listing(
    spark: SparkSession, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    """Each version the embedded engine replays from the one before (string and date
    partitions, awkward values included) lists the same files as delta-rs gives a fresh
    engine, and the range's file actions (what rows_added reads) are the same too:
    appends, a merge, a partition delete, a compaction (``dataChange=false``) and an
    overwrite."""
    engine = open_engine(spark, "embedded")
    assert isinstance(engine, EmbeddedDeltaEngine)
    listed: list[int] = []
    full_listing = engine._snapshots.snapshot_of

    def counting(root: str, table: Any, with_files: bool = True) -> Snapshot:
        if with_files:
            listed.append(table.version())
        return full_listing(root, table, with_files)

    engine._snapshots.snapshot_of = counting  # type: ignore[method-assign]
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, partition_by)
    engine.snapshot(path, 0)
    doomed = ROWS[1][SCHEMA.fieldNames().index(partition_by[0])]
    blank = (8, "", dt.date(2024, 1, 5), dt.datetime(2024, 1, 5), 8)
    writes = [
        lambda: engine.append(path, spark.createDataFrame(ROWS[:2], SCHEMA)),
        lambda: engine.append(
            path, spark.createDataFrame(ROWS[2:], SCHEMA), AppTransaction("a", 1)
        ),
        lambda: engine.append(path, spark.createDataFrame(ROWS, SCHEMA)),
        # The Arrow writer logs an empty string as "" (both engines read it as null).
        lambda: engine.append(path, spark.createDataFrame([blank], SCHEMA).toArrow()),
        lambda: engine.merge(path, spark.createDataFrame([ROWS[0]], SCHEMA), ["id"]),
        lambda: engine.compact(path, 1 << 20),
        lambda: engine.delete_partitions(path, [PartitionFilter(partition_by[0], "=", doomed)]),
        lambda: engine.overwrite(path, spark.createDataFrame(ROWS[1:3], SCHEMA)),
    ]
    for write in writes:
        write()
    latest = len(writes)
    replayed_actions = list(engine._file_actions(path, 0, latest))
    fresh = open_engine(spark, "embedded")
    assert isinstance(fresh, EmbeddedDeltaEngine)
    fresh._snapshots.replayed = lambda *_: None  # type: ignore[method-assign]  # delta-rs's listing only
    for version in range(latest + 1):
        assert described(engine.snapshot(path, version)) == described(
            fresh.snapshot(path, version)
        ), f"version {version}"
    listed_actions = list(fresh._file_actions(path, 0, latest))

    def actions(walk: list[Any]) -> list[Any]:
        return [
            (
                version,
                sorted((a.path, a.partition, a.data_change) for a in adds),
                sorted((r.path, r.partition, r.data_change) for r in removes),
            )
            for version, adds, removes in walk
        ]

    assert actions(replayed_actions) == actions(listed_actions)
    assert any(not a.data_change for _, adds, _ in replayed_actions for a in adds)
    if partition_by == ("at",):
        # Timestamps are Spark's to cast: a version that adds a file is listed in full.
        assert {1, 2, 3, 4} <= set(listed)
    else:
        assert listed == [0]  # every later version replayed from the first
    assert sorted(engine.rows_added(path, 0, latest).collect()) == sorted(
        fresh.rows_added(path, 0, latest).collect()
    )
