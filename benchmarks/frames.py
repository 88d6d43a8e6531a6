"""Benchmark inputs as Spark reads them in production: from Parquet files, not the driver.

``spark.createDataFrame(arrow_table)`` plans a ``LocalTableScan`` that holds every row in
the driver's plan. Even cached, each job over such a frame cost 0.6-0.9 s here for a
1M-row count, against 0.1-0.2 s for the same rows read from Parquet and cached (session
13, BENCHMARKS.md). That fixed cost per job favoured one-job methods (binning, Spark's own
join) over those that plan first (A-DSP's statistics), so every theta benchmark now reads
its inputs from files, as the pipeline reads Delta tables.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession


def stored_frame(
    spark: SparkSession, table: pa.Table, directory: Path, partitions: int | None = None
) -> DataFrame:
    """``table`` written once to Parquet under ``directory`` (named by its content) and
    read back; ``partitions`` splits it into that many files, for as many scan tasks."""
    digest = hashlib.sha256()
    for batch in table.to_batches():
        for column in batch.columns:
            for buffer in column.buffers():
                if buffer is not None:
                    digest.update(buffer)
    digest.update(str(table.schema).encode())
    target = directory / f"frame-{digest.hexdigest()[:16]}-{partitions or 0}"
    if not (target / "_SUCCESS").exists():
        target.mkdir(parents=True, exist_ok=True)
        pieces = partitions or 1
        step = -(-table.num_rows // pieces) if table.num_rows else 1
        for index in range(pieces):
            pq.write_table(table.slice(index * step, step), target / f"part-{index:05d}.parquet")
        (target / "_SUCCESS").touch()
    return spark.read.parquet(str(target))
