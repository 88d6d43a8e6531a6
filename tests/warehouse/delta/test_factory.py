"""The engine choice (``warehouse/delta/factory.py``): the embedded engines of one Spark
session share what they read, and a later engine still sees every change made by others
in between (another writer's commit, a table created again at the path)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from warehouse.delta import open_engine
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.delta.factory import SessionCaches

SCHEMA = T.StructType([T.StructField("id", T.LongType(), False)])


def ids(engine: EmbeddedDeltaEngine | object, path: str) -> list[int]:
    assert isinstance(engine, EmbeddedDeltaEngine)
    return sorted(row.id for row in engine.read(path).collect())


def test_engines_of_a_session_share_reads_and_see_changes_made_between_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    first = open_engine(spark, "embedded")
    first.append(path, spark.createDataFrame([(1,)], SCHEMA), partition_by=[])
    assert ids(first, path) == [1]
    # Another writer commits before the next command's engine reads.
    write_deltalake(path, pa.table({"id": pa.array([2], pa.int64())}), mode="append")
    second = open_engine(spark, "embedded")
    assert ids(second, path) == [1, 2]
    assert second.snapshot(path).version == 2
    # The table deleted and created again: the shared entries are not served for it.
    shutil.rmtree(path)
    write_deltalake(path, pa.table({"id": pa.array([7, 8], pa.int64())}), mode="append")
    write_deltalake(path, pa.table({"id": pa.array([9], pa.int64())}), mode="append")
    third = open_engine(spark, "embedded")
    assert ids(third, path) == [7, 8, 9]
    assert sorted(f.num_records or 0 for f in third.snapshot(path, 1).files) == [1, 2]


def test_caches_are_per_session() -> None:
    caches = SessionCaches()

    class Session:  # any object standing for a session
        pass

    one, other = Session(), Session()
    assert caches.of(one) is caches.of(one)
    assert caches.of(one) is not caches.of(other)
