"""The embedded delta-rs engine: round trips, time travel, replace, merge, changes, guards."""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.errors import (
    CommitError,
    ConfigError,
    DeltaTableError,
    NotAppendOnlyError,
    SchemaMismatchError,
    TableNotFoundError,
    UnsupportedOperationError,
    UnsupportedTableFeatureError,
)
from tests.helpers import assert_same_multiset
from warehouse.delta import AppTransaction, DeltaEngine, PartitionFilter, open_engine
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.spark import has_delta_jars

UTC = dt.UTC

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
]


def naive(rows: list[tuple]) -> list[tuple]:
    """Spark returns UTC timestamps as naive datetimes in a UTC session."""
    return [
        tuple(
            v.astimezone(UTC).replace(tzinfo=None) if isinstance(v, dt.datetime) else v for v in r
        )
        for r in rows
    ]


@pytest.fixture
def engine(spark: SparkSession) -> EmbeddedDeltaEngine:
    return EmbeddedDeltaEngine(spark)


@pytest.fixture(params=["embedded", "native"])
def any_engine(request: pytest.FixtureRequest, spark: SparkSession) -> DeltaEngine:
    """Both engines; the native one only where the delta-spark jars are on the classpath."""
    if request.param == "native":
        if not has_delta_jars(spark):
            pytest.skip(
                "native engine NOT TESTED: delta-spark jars are not on the Spark classpath "
                "(no Maven access on this machine); these tests run where the jars exist"
            )
        return open_engine(spark, "native")
    return EmbeddedDeltaEngine(spark)


@pytest.mark.parametrize("partition_by", [(), ("label",), ("label", "day", "at")])
def test_round_trip_keeps_awkward_partition_values(
    spark: SparkSession, any_engine: DeltaEngine, tmp_path: Path, partition_by: tuple[str, ...]
) -> None:
    engine = any_engine
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, partition_by)
    engine.append(path, spark.createDataFrame(AWKWARD_ROWS, SCHEMA))

    assert_same_multiset(engine.read(path), naive(AWKWARD_ROWS))
    # delta-rs reading the same table on its own is an independent check of the log we wrote.
    independent = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert_same_multiset(
        naive([tuple(r[c] for c in SCHEMA.fieldNames()) for r in independent]),
        naive(AWKWARD_ROWS),
    )


def test_time_travel_survives_appends_replace_and_vacuum(
    spark: SparkSession, any_engine: DeltaEngine, tmp_path: Path
) -> None:
    engine = any_engine
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
    assert_same_multiset(engine.read(path), [first[1], *replacement])


def test_vacuum_without_pins_drops_old_versions_files(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    engine.append(path, spark.createDataFrame([(1, "a", None, None, 1.0)], SCHEMA))
    engine.replace(
        path,
        spark.createDataFrame([(2, "a", None, None, 2.0)], SCHEMA),
        [PartitionFilter("label", "=", "a")],
    )
    deleted = engine.vacuum(path, retention_hours=0)
    assert len(deleted) == 1
    assert_same_multiset(engine.read(path), [(2, "a", None, None, 2.0)])


def test_replace_is_limited_to_partition_predicates(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, ("label",))
    data = spark.createDataFrame([(1, "a", None, None, 1.0)], SCHEMA)
    with pytest.raises(UnsupportedOperationError, match="partition columns"):
        engine.replace(path, data, [PartitionFilter("id", "=", 1)])
    with pytest.raises(DeltaTableError, match="outside the replace predicate"):
        engine.replace(path, data, [PartitionFilter("label", "=", "b")])


def test_replace_range_of_dates(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
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
    engine.replace(
        path,
        spark.createDataFrame(new, SCHEMA),
        [PartitionFilter("day", ">=", days[1]), PartitionFilter("day", "<", days[3])],
    )
    assert_same_multiset(
        engine.read(path), [(0, "x", days[0], None, 0.0), *new, (3, "x", days[3], None, 0.0)]
    )


def test_merge_upserts_and_deletes_and_feeds_cdf(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "m")
    schema = T.StructType([T.StructField("k", T.LongType()), T.StructField("v", T.StringType())])
    engine.create_table(path, schema, (), {"delta.enableChangeDataFeed": "true"})
    engine.append(path, spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], schema))
    flagged = T.StructType([*schema.fields, T.StructField("deleted", T.BooleanType())])
    changes = spark.createDataFrame([(2, "B", False), (3, None, True), (4, "d", False)], flagged)
    outcome = engine.merge(path, changes, ["k"], delete_flag="deleted")

    assert outcome.committed
    assert_same_multiset(engine.read(path), [(1, "a"), (2, "B"), (4, "d")])
    feed = engine.changes(path, 1, outcome.table_version).select("k", "v", "_change_type")
    assert_same_multiset(
        feed,
        [
            (2, "b", "update_preimage"),
            (2, "B", "update_postimage"),
            (3, "c", "delete"),
            (4, "d", "insert"),
        ],
    )


def test_changes_of_append_only_table_without_cdf(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
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


def test_app_transaction_commits_once(
    spark: SparkSession, any_engine: DeltaEngine, tmp_path: Path
) -> None:
    engine = any_engine
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    data = spark.createDataFrame(AWKWARD_ROWS[:2], SCHEMA)
    txn = AppTransaction("pipeline.stage", 7)
    assert engine.append(path, data, txn).committed
    again = engine.append(path, data, txn)
    older = engine.append(path, data, AppTransaction("pipeline.stage", 3))
    assert not again.committed and not older.committed
    assert engine.transaction_version(path, "pipeline.stage") == 7
    assert_same_multiset(engine.read(path), naive(AWKWARD_ROWS[:2]))


def test_error_after_commit_landed_is_not_retried_into_a_duplicate(
    spark: SparkSession,
    engine: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    data = spark.createDataFrame(AWKWARD_ROWS[:3], SCHEMA)
    real_commit = DeltaTable.create_write_transaction

    def commit_then_fail(self: DeltaTable, *args: object, **kwargs: object) -> None:
        real_commit(self, *args, **kwargs)
        raise OSError("post-commit checkpoint failed")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", commit_then_fail)
    first = engine.append(path, data, AppTransaction("app", 1))
    assert first.committed
    monkeypatch.undo()
    retry = engine.append(path, data, AppTransaction("app", 1))
    assert not retry.committed
    assert_same_multiset(engine.read(path), naive(AWKWARD_ROWS[:3]))


def test_error_before_commit_raises_commit_error(
    spark: SparkSession,
    engine: EmbeddedDeltaEngine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)

    def fail(self: DeltaTable, *args: object, **kwargs: object) -> None:
        raise OSError("storage unavailable")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", fail)
    with pytest.raises(CommitError, match="did not land"):
        engine.append(
            path, spark.createDataFrame(AWKWARD_ROWS[:1], SCHEMA), AppTransaction("app", 1)
        )
    monkeypatch.undo()
    assert engine.read(path).count() == 0


def test_schema_drift_append_is_refused_with_column_names(
    spark: SparkSession, any_engine: DeltaEngine, tmp_path: Path
) -> None:
    engine = any_engine
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
    with pytest.raises(SchemaMismatchError) as info:
        engine.append(path, spark.createDataFrame([("1", "a", None, 1.0, 1)], drifted))
    message = str(info.value)
    assert "missing columns: at (timestamp)" in message
    assert "unexpected columns: extra (int)" in message
    assert "column id: table has bigint, data has string" in message
    assert engine.snapshot(path).version == 0


def test_missing_table_is_a_clear_error(engine: EmbeddedDeltaEngine, tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError, match="no Delta table"):
        engine.snapshot(str(tmp_path / "nope"))


def _hand_written_table(root: Path, protocol: dict, configuration: dict) -> str:
    log = root / "_delta_log"
    log.mkdir(parents=True)
    schema = {
        "type": "struct",
        "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
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
    ],
)
def test_tables_with_unsupported_reader_features_are_refused(
    engine: EmbeddedDeltaEngine, tmp_path: Path, protocol: dict, configuration: dict, feature: str
) -> None:
    try:
        path = _hand_written_table(tmp_path / "t", protocol, configuration)
    except Exception:  # pragma: no cover
        raise
    with pytest.raises((UnsupportedTableFeatureError, DeltaTableError), match=feature):
        engine.read(path)


def test_arrow_schema_of_created_table_uses_utc_microseconds(
    engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    arrow = pa.schema(DeltaTable(path).schema().to_arrow())
    assert arrow.field("at").type == pa.timestamp("us", tz="UTC")


def test_engine_choice(spark: SparkSession) -> None:
    assert open_engine(spark, "embedded").name == "embedded"
    expected = "native" if has_delta_jars(spark) else "embedded"
    assert open_engine(spark, "auto").name == expected
    if not has_delta_jars(spark):
        with pytest.raises(ConfigError, match="not on the Spark classpath"):
            open_engine(spark, "native")
    with pytest.raises(ConfigError, match="must be auto, embedded or native"):
        open_engine(spark, "turbo")  # type: ignore[arg-type]
