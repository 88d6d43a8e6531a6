"""Validating a staged batch against its table's Great Expectations suites.

The suites a table names (or its config checks) run as a GX Checkpoint, on Spark or on
the batch collected into the driver's memory (:mod:`quality.batch_engine` chooses); the
outcome decides publish, quarantine or warn, and one row per expectation is appended to
``_quality/results``. Data Docs are rendered once per command from the stored results.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import DataFrame

from common.phase_clock import optional_phase
from common.rows import Rows
from pipeline.audit_batch import (
    PUBLISHED,
    QUARANTINED,
    UNCHECKED,
    WARNED,
    AuditViews,
    StagedBatch,
    TableAudit,
    ValidationInput,
    release,
)
from pipeline.handles import PipelineHandles
from quality.batch_engine import BatchEngine, InMemoryBatch, queries_views
from quality.config import QualityConfig
from quality.docs_queue import DocsQueue
from quality.results import RESULTS_SCHEMA, SuiteOutcome, result_rows
from warehouse.delta import AppTransaction

if TYPE_CHECKING:
    from great_expectations.core.expectation_suite import ExpectationSuite

logger = logging.getLogger(__name__)


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
