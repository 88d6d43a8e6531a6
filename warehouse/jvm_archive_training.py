"""The training run of the driver's class archive (:mod:`warehouse.jvm_archive`).

Run by :func:`warehouse.jvm_archive.build` as a child process: it starts a driver that
writes every class it loaded to the archive file given as its argument when it exits, and
runs what a pipeline command touches (DataFrames, Parquet, a join, an aggregate, Arrow both
ways, a Python UDF, JSON) so that those classes are in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from warehouse.jvm_archive import DRIVER_OPTIONS


def train(dump: Path) -> None:
    """Run the workload whose classes the archive keeps (what a pipeline command touches)
    in a driver that writes them to ``dump`` when it exits."""
    import tempfile

    import pyarrow as pa
    from pyspark.sql import functions as F

    from warehouse.spark import SparkSettings, build_session

    conf = {DRIVER_OPTIONS: f"-XX:ArchiveClassesAtExit={dump}"}
    # No delta-spark jars: the class path of the embedded engine, every session's default.
    settings = SparkSettings(app_name="jvm-archive", master="local[2]", conf=conf, delta_jars=False)
    spark = build_session(settings)
    with tempfile.TemporaryDirectory() as folder:
        left = spark.range(2000).withColumn("k", F.col("id") % 97)
        right = spark.createDataFrame(pa.table({"k": list(range(97)), "v": [1.5] * 97}))
        joined = left.join(F.broadcast(right), "k", "left").groupBy("k").agg(F.sum("v"))
        joined.write.mode("overwrite").parquet(f"{folder}/out")
        back = spark.read.parquet(f"{folder}/out")
        back.toArrow()
        back.collect()
        back.mapInArrow(lambda batches: batches, back.schema).count()
        left.join(right, left.k < right.k).count()
        spark.read.json(spark.sparkContext.parallelize(['{"a": 1}'])).count()
    spark.stop()


if __name__ == "__main__":
    train(Path(sys.argv[1]))
