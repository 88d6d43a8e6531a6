"""The training run of the driver's class archive (:mod:`warehouse.jvm_archive`).

Run by :func:`warehouse.jvm_archive.build` as a child process: it starts a driver that
writes every class it loaded to the archive file given as its argument when it exits, and
runs what a pipeline command touches (DataFrames, Parquet, a join, an aggregate, Arrow both
ways, a Python UDF, JSON, and delta-spark's table creation, commits, reads, merge and
vacuum) so that those classes are in it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from warehouse.jvm_archive import DRIVER_CLASS_PATH, DRIVER_OPTIONS, class_path_record


def train(dump: Path) -> None:
    """Run the workload whose classes the archive keeps (what a pipeline command touches)
    in a driver that writes them to ``dump`` when it exits."""
    import tempfile

    import pyarrow as pa
    from pyspark.sql import functions as F

    from warehouse.delta import AppTransaction, open_engine
    from warehouse.spark import SparkSettings, build_session

    # C1 only: the archive holds classes, not compiled code, and the short training run
    # finishes sooner without C2's compilations.
    conf = {DRIVER_OPTIONS: f"-XX:ArchiveClassesAtExit={dump} -XX:TieredStopAtLevel=1"}
    # Every session's class path: delta-spark's jars on the driver's (when `make jars`
    # fetched them), then Spark's.
    settings = SparkSettings(app_name="jvm-archive", master="local[2]", conf=conf)
    spark = build_session(settings)
    # The class path the archive is valid for; only drivers with the same one map it.
    class_path_record(dump).write_text(spark.sparkContext.getConf().get(DRIVER_CLASS_PATH, ""))
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
        if spark.conf.get("spark.sql.extensions", None):  # delta-spark is on the class path
            rows = joined.withColumnRenamed("sum(v)", "v")
            native = open_engine(spark, "native")
            table = f"{folder}/delta"
            native.create_table(table, rows.schema, ("k",), {"delta.enableChangeDataFeed": "true"})
            native.append(table, rows, AppTransaction("train", 0))
            native.merge(table, rows, ["k"])
            native.changes(table, 1, native.snapshot(table).version).count()
            native.read(table).count()
            native.overwrite(table, rows)
            native.vacuum(table, retention_hours=0)
    spark.stop()


if __name__ == "__main__":
    train(Path(sys.argv[1]))
