"""Choosing the Delta engine for a session.

``auto`` (the default) is the embedded delta-rs engine in every setting: in-process,
over Spark Connect and on a standalone cluster the driver makes the commits either way,
and delta-rs commits in 0.1-0.4 s where delta-spark takes 1.2-2.2 s (a snapshot state
read per transaction), a snapshot in 0.01 s against 0.5-0.7 s, and the demo interval
1.4-1.7x faster (BENCHMARKS.md, "Delta engines"). ``native`` (delta-spark through
``format("delta")``) is there for who wants it and needs its jars on the classpath; it is
refused under Spark Connect, whose client has no JVM.

The embedded engines of one Spark session share what they read (:class:`ReadCaches`, each
entry checked against the table's commit files when served): a warm worker runs every
command on one session, and its commands then open each table once, not once a command
(on an object store, a listing and a GET of every commit since the checkpoint each time)."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

from common.errors import ConfigError
from warehouse.delta.api import EngineChoice
from warehouse.delta.engine import DeltaEngine

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from warehouse.delta.embedded import ReadCaches

logger = logging.getLogger(__name__)


class SessionCaches:
    """The :class:`ReadCaches` of each live Spark session, dropped with the session."""

    def __init__(self) -> None:
        self._by_session: weakref.WeakKeyDictionary[object, ReadCaches] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, session: object) -> ReadCaches:
        from warehouse.delta.embedded import ReadCaches

        try:
            return self._by_session.setdefault(session, ReadCaches())
        except TypeError:  # a session that cannot be weakly referenced: caches of its own
            return ReadCaches()


# The process's sessions; engines are made per command, the session outlives them.
_SESSION_CACHES = SessionCaches()


def open_engine(
    session: SparkSession,
    choice: EngineChoice = "auto",
    table_properties: Mapping[str, str] | None = None,
) -> DeltaEngine:
    """Return the engine for ``choice``; ``auto`` is the embedded engine (module docstring).

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
    if choice == "native":
        from warehouse.delta.native import NativeDeltaEngine

        logger.info("using native delta-spark engine")
        return NativeDeltaEngine(session, table_properties=table_properties)
    from warehouse.delta.embedded import EmbeddedDeltaEngine

    if choice == "auto":
        logger.info(
            "using embedded delta-rs engine (engine auto: its commits and snapshots cost a "
            "fraction of delta-spark's%s; set warehouse.engine: native for delta-spark)",
            "" if native_available else ", and delta-spark's jars are not on the classpath",
        )
    else:
        logger.info("using embedded delta-rs engine")
    return EmbeddedDeltaEngine(
        session, table_properties=table_properties, caches=_SESSION_CACHES.of(session)
    )
