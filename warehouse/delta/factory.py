"""Choosing the Delta engine for a session: native delta-spark when its jars are on the
classpath, the embedded delta-rs engine otherwise (and always under Spark Connect unless
``native`` is asked for, which is refused there)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from common.errors import ConfigError
from warehouse.delta.api import DeltaEngine, EngineChoice

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def open_engine(
    session: SparkSession,
    choice: EngineChoice = "auto",
    table_properties: Mapping[str, str] | None = None,
) -> DeltaEngine:
    """Return the engine for ``choice``; ``auto`` prefers native delta-spark when present.

    ``table_properties`` start every table the engine creates (see ``DeltaEngine``).
    """
    from warehouse.spark import has_delta_jars, is_connect

    if choice not in ("auto", "embedded", "native"):
        raise ConfigError(f"delta engine must be auto, embedded or native, got {choice!r}")
    if choice == "native" and is_connect(session):
        raise ConfigError(
            "warehouse.engine: native drives delta-spark's JVM classes from the driver, which a "
            "Spark Connect client does not have; use engine 'auto' or 'embedded' with "
            "spark.remote (they write Delta with delta-rs and Spark's Parquet writer)"
        )
    native_available = has_delta_jars(session)
    if choice == "native" and not native_available:
        raise ConfigError(
            "delta engine 'native' was requested but io.delta.tables.DeltaTable is not on the "
            "Spark classpath; add the delta-spark jars or use engine 'auto'/'embedded'"
        )
    if choice == "native" or (choice == "auto" and native_available):
        from warehouse.delta.native import NativeDeltaEngine

        logger.info("using native delta-spark engine")
        return NativeDeltaEngine(session, table_properties=table_properties)
    from warehouse.delta.embedded import EmbeddedDeltaEngine

    logger.info("using embedded delta-rs engine")
    return EmbeddedDeltaEngine(session, table_properties=table_properties)
