"""The batch under audit, its validation, and what its audit decided.

A batch is read lazily (:class:`StagedBatch`): a live batch validated in memory and
published by adding its files to gold never plans a Spark read. :class:`AuditValidation`
runs the suites a table names (or its config checks) as a GX Checkpoint, on Spark or on the
batch collected into the driver's memory (:mod:`quality.batch_engine` chooses), and appends
one row per expectation to ``_quality/results``; Data Docs are rendered once per command
from the stored results. :class:`TableAudit` is the decision of one output table's audit:
publish, quarantine or warn, one of the actions below.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.phase_clock import optional_phase
from common.rows import Rows
from joins.columns import INTERVAL_START
from pipeline.handles import PipelineHandles
from quality.batch_engine import BatchEngine, InMemoryBatch, queries_views
from quality.config import QualityConfig
from quality.docs_queue import DocsQueue
from quality.results import RESULTS_SCHEMA, SuiteOutcome, result_rows
from warehouse.delta import AppTransaction, DeltaEngine
from warehouse.delta.live_rows import live_rows_added

if TYPE_CHECKING:
    from great_expectations.core.expectation_suite import ExpectationSuite

logger = logging.getLogger(__name__)

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


class AuditValidation:
    """Runs an output table's suites over a staged batch and writes their results."""

    def __init__(self, handles: PipelineHandles, gate: Any = None) -> None:
        self.config, self.spark = handles.config, handles.spark
        self.engine, self.layout = handles.engine, handles.layout
        self._gate = gate

    @property
    def gate(self) -> Any:
        if self._gate is None:
            from quality.gate import QualityGate  # GX loads only when a suite runs

            assets = self.config.docs_assets_dir
            self._gate = QualityGate.of(self.layout.gx_project(), Path(assets) if assets else None)
        return self._gate

    def update_docs(self) -> None:
        """Render this command's validation results into Data Docs: one site build.

        Data Docs are a view of results already stored (GX's store and ``_quality/results``):
        a rendering error is logged, never allowed to replace the audit's own outcome.
        """
        if self._gate is None:
            return
        queue = DocsQueue(self.layout.gx_project()) if self.config.data_docs == "report" else None
        with optional_phase(self.engine.clock, "validate"):
            try:
                self._gate.update_docs(queue)
            except Exception as e:  # noqa: BLE001 - GX raises many unrelated types
                logger.error("could not render Data Docs for this run's results: %s", e)

    def render_queued_docs(self) -> int:
        """Render the Data Docs pages ``validate`` queued (``data_docs: report``); how many.
        GX is imported only when the queue holds pages."""
        queue = DocsQueue(self.layout.gx_project())
        if not queue.pending():
            return 0
        rendered = int(self.gate.render_queued(queue))
        logger.info("Data Docs: rendered %d queued page(s)", rendered)
        return rendered

    def prepare(
        self,
        table: str,
        staged: StagedBatch,
        views: AuditViews,
        expectations: Sequence[tuple[str, Mapping[str, Any]]],
        engine: BatchEngine,
        rows: int | None,
    ) -> ValidationInput:
        """The batch in the form ``engine`` validates: on Spark its frame (and the audit
        views as Spark frames), in memory its rows collected into the driver (and the views
        as Arrow tables). Views are built only when a suite queries them; where a suite
        holds SQL expectations the Spark batch and views are cached for the validation (GX
        computes each SQL expectation twice: :mod:`quality.batch_engine`). ``rows``: the
        batch's row count where the Delta log gave it, else it is counted here.

        Call :meth:`ValidationInput.release` when done, whatever happened."""
        frames: dict[str, DataFrame] = {}
        collected: dict[str, pa.Table] | None = None
        try:
            if queries_views(expectations):
                built = views.build()
                if engine.name == "spark":
                    staged.cache()
                    frames = {n: v.to_spark(self.spark).cache() for n, v in built.items()}
                else:
                    if views.in_driver:
                        with optional_phase(self.engine.clock, "validate"):
                            collected = self._arrow_views(table, built)
                    if collected is None:
                        frames = {name: view.to_spark(self.spark) for name, view in built.items()}
            counted = staged.frame().count() if rows is None else rows
            in_memory = None
            if engine.name == "pandas":
                with optional_phase(self.engine.clock, "validate"):
                    # A live batch is whole files of silver: read them in the driver, no
                    # Spark job; the views its suites query beside it, in memory too.
                    if collected is None:
                        collected = {name: view.toArrow() for name, view in frames.items()}
                    in_memory = InMemoryBatch(
                        staged.rows.to_arrow().to_pandas(), staged.schema_frame(), collected
                    )
        except BaseException:
            release(staged, frames)
            raise
        return ValidationInput(staged, frames, counted, in_memory)

    @staticmethod
    def _arrow_views(table: str, views: dict[str, Rows]) -> dict[str, pa.Table] | None:
        """The audit views built in the driver, or None when that failed (memory, say):
        the Spark views are then built and collected instead."""
        try:
            return {name: view.to_arrow() for name, view in views.items()}
        except (pa.ArrowException, MemoryError) as e:
            logger.warning(
                "audit %s: building the audit views in memory failed (%s); Spark builds them",
                table,
                str(e).splitlines()[0][:300],
            )
            return None

    def decide(
        self,
        table: str,
        run_id: str,
        prepared: ValidationInput,
        batch: tuple[int, int],
        failures: list[str],
        suites: list[ExpectationSuite],
    ) -> TableAudit:
        """Run the suites over the prepared batch and write their results."""
        rows = prepared.rows
        quality = self.config.quality.get(table)
        outcomes = self._run_suites(table, run_id, prepared, suites)
        failures = failures + [f"{o.suite}: {e.describe()}" for o in outcomes for e in o.failures]
        warn_only = quality is not None and quality.warn_only
        if failures:
            action = WARNED if warn_only else QUARANTINED
        else:
            action = PUBLISHED if suites else UNCHECKED
        audit = TableAudit(table, run_id, batch, action, rows, failures, outcomes)
        self._write_results(audit)
        log = logger.error if action == QUARANTINED else logger.info
        log(
            "audit %s batch v%d..v%d: %d row(s) %s%s",
            table,
            batch[0] + 1,
            batch[1],
            rows,
            action,
            f"; failed: {'; '.join(failures)}" if failures else "",
        )
        if action == UNCHECKED:
            logger.warning("%s has no quality checks configured; published unchecked", table)
        return audit

    def suites(self, table: str, quality: QualityConfig | None) -> list[ExpectationSuite]:
        """The suites that check ``table``: those it names, or else its config checks."""
        if quality is None or not quality.checked:
            return []
        from quality.suites import config_suite, load_suite

        directory = Path(self.config.expectations_dir)
        with optional_phase(self.engine.clock, "validate"):  # GX's import included
            return [load_suite(directory, name, quality) for name in quality.suites] or [
                config_suite(table, quality)
            ]

    def _run_suites(
        self,
        table: str,
        run_id: str,
        prepared: ValidationInput,
        suites: list[ExpectationSuite],
    ) -> list[SuiteOutcome]:
        """Validate the prepared batch against ``suites``: collected (GX's pandas engine,
        DuckDB for SQL) or on Spark."""
        if not suites:
            return []
        with optional_phase(self.engine.clock, "validate"):
            return [
                self.gate.validate(table, suite, prepared.validated(), run_id, views=prepared.views)
                for suite in suites
            ]

    def _write_results(self, audit: TableAudit) -> None:
        rows = result_rows(
            audit.run_id,
            audit.table,
            audit.outcomes,
            audit.batch,
            audit.action,
            datetime.now(UTC).replace(tzinfo=None),
        )
        if not rows:
            return
        path = self.layout.quality_results()
        self.engine.create_table(path, RESULTS_SCHEMA)
        self.engine.append_rows(
            path, rows, RESULTS_SCHEMA, AppTransaction(f"quality.{audit.table}", audit.batch[1])
        )
