"""The batch under audit, and what its audit decided.

A batch is read lazily (:class:`StagedBatch`): a live batch validated in memory and
published by adding its files to gold never plans a Spark read. :class:`TableAudit` is the
decision of one output table's audit, one of the actions below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.rows import Rows
from joins.columns import INTERVAL_START
from quality.batch_engine import InMemoryBatch
from quality.results import SuiteOutcome
from warehouse.delta import DeltaEngine
from warehouse.delta.live_rows import live_rows_added

PUBLISHED, QUARANTINED, WARNED, UNCHECKED, NOTHING_NEW = (
    "published",
    "quarantined",
    "published_with_warnings",
    "published_unchecked",
    "nothing_new",
)


@dataclass
class TableAudit:
    table: str
    run_id: str
    batch: tuple[int, int]
    action: str
    rows: int = 0
    failures: list[str] = field(default_factory=list)
    outcomes: list[SuiteOutcome] = field(default_factory=list)


@dataclass(frozen=True)
class AuditViews:
    """How to build a batch's audit views (``build``), read in the form the batch is
    validated in: Spark frames, or Arrow tables in the driver's memory where the engine
    reads Arrow itself (``in_driver``; else the Spark frames are collected). Built only
    when a suite reads them."""

    build: Callable[[], dict[str, Rows]]
    in_driver: bool = False


class StagedBatch:
    """The batch under audit as a Spark frame, planned only when something reads its rows.

    A live batch validated in memory is read in the driver and published by adding its
    files to gold, so its Spark frame (a read of each version's files: planning alone cost
    0.1-0.2 s a table) is built only for Spark validation, a count the log cannot give, a
    quarantine or a backfill's replace. The checks on Spark types need only its schema:
    :meth:`schema_frame` is an empty frame of the table's schema, which every file of a
    Delta table version has."""

    def __init__(self, spark: SparkSession, rows: Rows, schema: T.StructType):
        self._spark = spark
        self.rows = rows
        self._schema = schema
        self._frame: DataFrame | None = None
        self._cached = False

    def frame(self) -> DataFrame:
        """The batch's rows as a Spark frame (planned once)."""
        if self._frame is None:
            self._frame = self.rows.to_spark(self._spark)
        return self._frame

    def cache(self) -> DataFrame:
        """The batch's rows, cached until :meth:`unpersist`."""
        self._frame = self.frame().cache()
        self._cached = True
        return self._frame

    def unpersist(self) -> None:
        if self._cached and self._frame is not None:
            self._frame.unpersist()
            self._cached = False

    def schema_frame(self) -> DataFrame:
        """A frame with the batch's schema: the batch if it was read, else an empty one."""
        if self._frame is not None:
            return self._frame
        return self._spark.createDataFrame([], self._schema)


@dataclass(frozen=True)
class ValidationInput:
    """A staged batch in the form its validation reads (``AuditValidation.prepare``): its
    row count, the batch collected into the driver (``in_memory``; None: validated on
    Spark as the staged frame) and the audit views as Spark frames (``views``: for the
    Spark engine's SQL expectations). :meth:`release` drops what was cached for it."""

    staged: StagedBatch
    views: dict[str, DataFrame]
    rows: int
    in_memory: InMemoryBatch | None = None

    def validated(self) -> DataFrame | InMemoryBatch:
        """What GX validates: the collected batch, or the staged Spark frame."""
        return self.staged.frame() if self.in_memory is None else self.in_memory

    def release(self) -> None:
        release(self.staged, self.views)


def release(staged: StagedBatch, views: Mapping[str, DataFrame]) -> None:
    """Drop what was cached of a batch and its views for a validation."""
    staged.unpersist()
    for view in views.values():
        view.unpersist()


def live_batch(
    spark: SparkSession, engine: DeltaEngine, silver: str, audited: int, latest: int
) -> StagedBatch:
    """Rows of files added in (audited, latest] still live at latest, minus backfills'."""
    return StagedBatch(
        spark,
        live_rows_added(engine, silver, audited, latest),
        engine.snapshot(silver, latest).schema,
    )


def interval_batch(
    spark: SparkSession,
    engine: DeltaEngine,
    silver: str,
    version: int,
    interval: tuple[datetime, datetime],
) -> StagedBatch:
    """Rows of ``silver`` at ``version`` whose interval starts in ``interval``."""
    start, end = interval
    return StagedBatch(
        spark,
        Rows(
            spark=lambda _spark: engine.read(silver, version=version).where(
                (F.col(INTERVAL_START) >= F.lit(start)) & (F.col(INTERVAL_START) < F.lit(end))
            )
        ),
        engine.snapshot(silver, version).schema,
    )
