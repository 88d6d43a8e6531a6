"""Compaction: small files rewritten per partition in one dataChange=false commit."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from tests.helpers import assert_same_multiset
from warehouse.delta import AppTransaction, open_engine
from warehouse.delta.api import EngineChoice, PartitionFilter

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


@pytest.mark.parametrize("choice", ["embedded", "native"])
def test_a_follower_reads_the_same_added_rows_across_a_compaction(
    spark: SparkSession, tmp_path: Path, choice: EngineChoice
) -> None:
    """A stage input compacted between its consumer's steps: the rows added after the
    consumer's version are the same rows, with the versions that added them; the compaction
    itself adds none and removes none; a replace after it still takes its partition out."""
    engine = open_engine(spark, choice)
    path = str(tmp_path / "bronze")
    engine.create_table(path, SCHEMA, ("part",))

    def append(batch: int) -> list[tuple[int, str]]:
        written = [(batch * 10 + i, "a" if i % 2 else "b") for i in range(4)]
        engine.append(path, spark.createDataFrame(written, SCHEMA).repartition(1, "part"))
        return written

    append(0)
    consumed = engine.snapshot(path).version  # what the follower has read
    added = [(*row, consumed + b) for b in (1, 2, 3) for row in append(b)]
    before = engine.snapshot(path).version
    assert_same_multiset(engine.rows_added(path, consumed, before), added)

    done = engine.compact(path, target_file_bytes=64 * 2**20)
    assert done.version == before + 1 and done.files_removed == 8

    assert_same_multiset(engine.rows_added(path, consumed, done.version), added)
    assert_same_multiset(engine.rows_added(path, before, done.version), [])
    assert engine.rows_by_version(path, before, done.version) == [(done.version, 0)]
    inserts = engine.changes(path, consumed, done.version).drop("_change_type")
    assert_same_multiset(inserts, added)  # no NotAppendOnlyError: nothing was removed

    later = [(*row, done.version + 1) for row in append(4)]
    assert_same_multiset(engine.rows_added(path, consumed, done.version + 1), added + later)
    # A backfill replaces partition "a": its rows of every batch go, the new row comes.
    replacement = [(99, "a")]
    outcome = engine.replace(
        path,
        spark.createDataFrame(replacement, SCHEMA),
        [PartitionFilter("part", "=", "a")],
    )
    expected = [r for r in added + later if r[1] == "b"] + [(99, "a", outcome.table_version)]
    assert_same_multiset(engine.rows_added(path, consumed, outcome.table_version), expected)
