"""Compaction: small files rewritten per partition in one dataChange=false commit."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from tests.helpers import assert_same_multiset
from warehouse.delta import AppTransaction, open_engine
from warehouse.delta.api import EngineChoice

SCHEMA = T.StructType(
    [T.StructField("id", T.LongType(), False), T.StructField("part", T.StringType(), False)]
)


@pytest.mark.parametrize("choice", ["embedded", "native"])
def test_compaction_keeps_every_version_s_rows_and_runs_once(
    spark: SparkSession, tmp_path: Path, choice: EngineChoice
) -> None:
    engine = open_engine(spark, choice)
    engine.commit_metadata = {"enrichment.run": "maintain m1"}
    path = str(tmp_path / "gold")
    engine.create_table(path, SCHEMA, ("part",))
    rows = []
    for batch in range(4):  # four small files in each of two partitions
        written = [(batch * 10 + i, "a" if i % 2 else "b") for i in range(6)]
        engine.append(path, spark.createDataFrame(written, SCHEMA).repartition(1, "part"),
                      AppTransaction("publish.gold", batch))  # fmt: skip
        rows += written
    before = engine.snapshot(path)
    assert len(before.files) == 8

    done = engine.compact(path, target_file_bytes=64 * 2**20)

    after = engine.snapshot(path)
    assert (done.files_removed, done.files_added, done.version) == (8, 2, before.version + 1)
    assert after.version == before.version + 1 and len(after.files) == 2
    assert_same_multiset(engine.read(path), rows)
    assert_same_multiset(engine.read(path, version=before.version), rows)  # time travel
    assert engine.transaction_version(path, "publish.gold") == 3  # app transactions stay
    last = engine.history(path, 1)[0]
    assert last["operation"] == "OPTIMIZE" and last.get("enrichment.run") == "maintain m1", last
    again = engine.compact(path, target_file_bytes=64 * 2**20)
    assert (again.files_added, again.version) == (0, None)
    assert engine.snapshot(path).version == after.version
