"""Spark session builder with the settings every job of this product relies on.

- UTC session time zone: Delta stores timestamp partition values without a zone, and they
  must not shift with the driver's locale.
- Parquet timestamps as INT64 micros: the Delta protocol's encoding (Spark's default is INT96).
- The raw local file system and no ``_SUCCESS`` markers: Spark's checksum side files and
  markers would otherwise be left in table directories as untracked clutter.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

REQUIRED_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
    "spark.hadoop.fs.file.impl.disable.cache": "true",
    "spark.hadoop.parquet.summary.metadata.level": "NONE",
}

EMBEDDED_DEFAULTS: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "4g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
}


@dataclass(frozen=True)
class SparkSettings:
    """Where Spark runs and which extra settings it gets.

    ``master`` defaults to an embedded ``local[2]``; point it at ``spark://host:7077`` (or set
    ``SPARK_MASTER``) to scale out without changing any job code.
    """

    app_name: str = "enrichment"
    master: str = field(default_factory=lambda: os.environ.get("SPARK_MASTER", "local[2]"))
    conf: Mapping[str, str] = field(default_factory=dict)


def build_session(settings: SparkSettings | None = None) -> SparkSession:
    """Return the active session, or build one with the product's required settings."""
    settings = settings or SparkSettings()
    # Python workers must run this interpreter (its packages: pyarrow, numpy), not whatever
    # "python3" is first on the PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(settings.app_name).master(settings.master)
    for key, value in {**EMBEDDED_DEFAULTS, **settings.conf, **REQUIRED_CONF}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    for key, value in REQUIRED_CONF.items():
        if not key.startswith("spark.hadoop."):
            session.conf.set(key, value)
    logger.info("spark session %s on %s", session.version, settings.master)
    return session


def has_delta_jars(session: SparkSession) -> bool:
    """True when the delta-spark JVM classes are on the driver's classpath."""
    jvm = session._jvm
    if jvm is None:
        return False
    try:
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable")
    except Exception:  # noqa: BLE001 - py4j raises a generic Py4JJavaError on ClassNotFound
        return False
    return True
