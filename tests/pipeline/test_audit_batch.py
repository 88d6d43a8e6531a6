"""Preparing a staged batch for its validation (``pipeline/audit_batch.py``): what it
caches for the validation is released when preparing fails part way."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from common.rows import Rows
from pipeline.audit_batch import AuditValidation, AuditViews, StagedBatch
from pipeline.handles import PipelineHandles
from quality.batch_engine import BatchEngine
from tests.pipeline.ssbj_harness import SsbjHarness


def test_a_preparation_that_fails_part_way_leaves_nothing_cached(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left")
    validation = AuditValidation(PipelineHandles(h.config, h.spark, h.engine, h.store))
    # The batch's count fails (a row the filter cannot evaluate) after the batch and the
    # audit view were cached for a SQL expectation on Spark.
    refuse = F.udf(lambda v: 1 // (v - 1), "int")
    batch = spark.range(3).where(refuse(F.col("id")) >= 0)
    view = spark.range(2)
    staged = StagedBatch(spark, Rows.of(batch), batch.schema)
    views = AuditViews(build=lambda: {"audit_input": Rows.of(view)})
    with pytest.raises(Exception, match="ZeroDivisionError"):
        validation.prepare(
            "out",
            staged,
            views,
            [("unexpected_rows_expectation", {})],
            BatchEngine("spark", "test"),
            rows=None,
        )
    assert not staged.frame().is_cached
    assert not view.is_cached
