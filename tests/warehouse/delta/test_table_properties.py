"""Table properties every created table starts with: checkpoints every N commits."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from warehouse.delta import open_engine
from warehouse.delta.api import CDF_PROPERTY, CHECKPOINT_INTERVAL_PROPERTY, EngineChoice

SCHEMA = T.StructType([T.StructField("id", T.LongType(), False)])


@pytest.mark.parametrize("choice", ["embedded", "native"])
def test_created_tables_checkpoint_every_interval_and_keep_their_own_properties(
    spark: SparkSession, tmp_path: Path, choice: EngineChoice
) -> None:
    engine = open_engine(spark, choice, {CHECKPOINT_INTERVAL_PROPERTY: "3"})
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA, properties={CDF_PROPERTY: "true"})
    for i in range(7):
        engine.append(path, spark.createDataFrame([(i,)], SCHEMA))
    properties = engine.snapshot(path).properties
    assert properties[CHECKPOINT_INTERVAL_PROPERTY] == "3"
    assert properties[CDF_PROPERTY] == "true"
    checkpoints = sorted(p.name for p in (tmp_path / "t" / "_delta_log").glob("*.checkpoint*"))
    assert checkpoints, f"{choice}: no checkpoint after 8 commits with interval 3"
    # The other Delta readers start from the checkpoint and still see every row.
    assert sorted(DeltaTable(path).to_pyarrow_table()["id"].to_pylist()) == list(range(7))
    assert spark.read.format("delta").load(path).count() == 7
