"""Spark schemas of the pipeline's tables, derived from the config's column declarations."""

from __future__ import annotations

from pyspark.sql import types as T

from pipeline.config import DECIMAL, ColumnSpec, StreamConfig

SOURCE_FILE = "_source_file"
BATCH_ID = "_batch_id"
MASTER_VERSION = "_master_version"
INTERVAL_START = "_interval_start"

_SIMPLE: dict[str, T.DataType] = {
    "string": T.StringType(),
    "bigint": T.LongType(),
    "int": T.IntegerType(),
    "smallint": T.ShortType(),
    "double": T.DoubleType(),
    "float": T.FloatType(),
    "boolean": T.BooleanType(),
    "date": T.DateType(),
    "timestamp": T.TimestampType(),
}


def spark_type(name: str) -> T.DataType:
    match = DECIMAL.match(name)
    if match:
        return T.DecimalType(int(match.group(1)), int(match.group(2)))
    return _SIMPLE[name]


def declared_schema(columns: list[ColumnSpec]) -> T.StructType:
    # Landing data is parsed leniently (nullable everywhere) and non-null checks become
    # quarantine reasons, so a bad record is kept rather than failing the whole file.
    return T.StructType([T.StructField(c.name, spark_type(c.type), True) for c in columns])


def bronze_schema(stream: StreamConfig) -> T.StructType:
    return T.StructType(
        [
            *declared_schema(stream.columns).fields,
            T.StructField(SOURCE_FILE, T.StringType(), True),
            T.StructField(BATCH_ID, T.LongType(), True),
        ]
    )


QUARANTINE_SCHEMA = T.StructType(
    [
        T.StructField("stream", T.StringType(), True),
        T.StructField("source_file", T.StringType(), True),
        T.StructField("record", T.StringType(), True),
        T.StructField("reason", T.StringType(), True),
        T.StructField(BATCH_ID, T.LongType(), True),
        T.StructField("quarantined_at", T.TimestampType(), True),
    ]
)
