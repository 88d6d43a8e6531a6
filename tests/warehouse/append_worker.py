"""A writer process for crash and concurrency tests: appends id ranges to a Delta table.

Usage: python -m tests.warehouse.append_worker TABLE APP_ID FIRST_ID ROWS BATCHES
Each batch is committed with app transaction (APP_ID, batch number).
"""

from __future__ import annotations

import sys

from pyspark.sql import types as T

from warehouse.delta import AppTransaction
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.spark import SparkSettings, build_session

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("writer", T.StringType())])


def main(argv: list[str]) -> int:
    table, app_id, first_id, rows, batches = (
        argv[0],
        argv[1],
        int(argv[2]),
        int(argv[3]),
        int(argv[4]),
    )
    spark = build_session(
        SparkSettings(
            app_name=app_id, master="local[1]", conf={"spark.sql.shuffle.partitions": "1"}
        )
    )
    engine = EmbeddedDeltaEngine(spark)
    for batch in range(batches):
        start = first_id + batch * rows
        data = spark.createDataFrame([(i, app_id) for i in range(start, start + rows)], SCHEMA)
        engine.append(table, data.repartition(2), AppTransaction(app_id, batch))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
