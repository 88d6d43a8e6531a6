"""Write, audit, publish: only batches that pass their suites become visible.

The operators write to ``silver/<table>``, the staging area. For every output table, in
stage order, the audit of a run:

1. takes the staged batch: the rows added to ``silver/<table>`` since the last audited
   version ``a`` up to the current version ``b``;
2. builds the audit views (:mod:`quality.audit_views`) from the stage's new input tuples
   and the pending tuples its driver accounts for (``StageDriver.pending_*``: those
   pending now, and those pending at the last audit, which must be emitted, published or
   still pending), and validates the batch against each of the table's suites with
   a GX Checkpoint (results to the GX stores, Data Docs refreshed);
3. appends one row per expectation to the ``_quality/results`` Delta table;
4. publishes the batch to ``gold/<table>`` if every suite passed (or the table is
   warn-only), else appends it to ``quarantine/_outputs/<table>`` with the failed
   expectations attached; a batch whose upstream table was quarantined in the same run is
   quarantined too;
5. records ``b`` as audited.

Publishing is one Delta commit carrying the app transaction ``(publish.<table>, b)``. A
live batch is whole files of silver, and the embedded engine adds those files to gold as
they are (hard links on a local file system), so publishing reads and writes no rows.
Between the decision and that commit the audit writes its **intent** to the state store:
the batch bounds, the decision (publish or quarantine, with the failures) and the audit
state it will record. Whatever runs next for the table (a retry of the same run, the next
interval's validate, or a backfill) first finishes an open intent: it re-reads exactly the
batch ``(a, b]``, repeats the commit (skipped by the app transaction if it landed) and
records the state. So a batch is published at most once even when new rows were staged
after a crash, and exactly once when the audit completes. A failed audit raises
:class:`ValidationFailedError` naming the failed expectations and their counts; retrying
the same run raises it again.

Backfills beside live runs: a backfill first records that it is running, then replaces
the interval in ``silver`` (its commits tagged as a backfill's) and ``gold``. A live batch
is the rows of files added in ``(a, b]`` that are still live at ``b``, minus the files
backfill commits added (:func:`warehouse.delta.api.live_rows_added`): rows a backfill
replaced are never published twice, and rows a backfill published are not published again
as part of a live batch. While a
backfill is recorded as running (it died), live publishes of the tables it touches wait
with a clear error until the backfill is rerun to completion.

This module holds the audit's runs (live, backfill) and the resolution of quarantined
batches; the parts are modules of their own: the batch under audit and its validation
(:mod:`pipeline.audit_batch`), the published view (:mod:`pipeline.audit_published`), the
intent and its commits (:mod:`pipeline.audit_intent`) and the audit state
(:mod:`pipeline.audit_state`).
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F

from common.errors import ConfigError, ValidationFailedError
from common.rows import Rows
from joins.columns import INTERVAL_START
from pipeline.audit_batch import (
    NOTHING_NEW,
    QUARANTINED,
    AuditValidation,
    AuditViews,
    TableAudit,
    interval_batch,
    live_batch,
)
from pipeline.audit_intent import (
    BATCH_TO,
    FAILED_EXPECTATIONS,
    QUARANTINED_AT,
    RUN_ID,
    AuditIntents,
    publish_rows,
)
from pipeline.audit_published import PublishedTuples
from pipeline.audit_state import AuditRecord, load_state, require_no_backfill_running, save_state
from pipeline.drivers import StageDrivers
from pipeline.handles import PipelineHandles
from quality.audit_views import (
    INPUT_VIEW,
    PENDING_VIEW,
    PUBLISHED_VIEW,
    no_pending,
    no_published,
)
from warehouse.delta import AppTransaction
from warehouse.delta.live_rows import count_live_rows_added

logger = logging.getLogger(__name__)


class AuditPublisher:
    """Audits staged output batches and publishes or quarantines them."""

    def __init__(
        self, handles: PipelineHandles, gate: Any = None, drivers: StageDrivers | None = None
    ) -> None:
        self.config, self.spark = handles.config, handles.spark
        self.engine, self.store, self.layout = handles.engine, handles.store, handles.layout
        self.drivers = drivers or StageDrivers(handles)
        self.inputs = self.drivers.inputs
        self.validation = AuditValidation(handles, gate)
        self.published = PublishedTuples(self.spark, self.engine, self.layout)
        self.intents = AuditIntents(handles, self.validation)

    @property
    def gate(self) -> Any:
        return self.validation.gate

    def render_queued_docs(self) -> int:
        """Render the Data Docs pages ``validate`` queued (``data_docs: report``); how many.
        GX is imported only when the queue holds pages."""
        return self.validation.render_queued_docs()

    # ------------------------------------------------------------------ live runs

    def audit_run(
        self, run_id: str, extra_failures: dict[str, list[str]] | None = None
    ) -> list[TableAudit]:
        """Audit every output table's new batch; raise if any batch was quarantined."""
        audits: list[TableAudit] = []
        quarantined: set[str] = set()
        try:
            for table in self.config.outputs():
                failures = list((extra_failures or {}).get(table, []))
                stage = self.config.producing_stage(table)
                if stage.input in quarantined:
                    failures.append(f"upstream table {stage.input} was quarantined in this run")
                audit = self._audit_live_batch(table, run_id, failures)
                if audit.action == QUARANTINED:
                    quarantined.add(table)
                audits.append(audit)
        finally:
            self.validation.update_docs()  # whatever was validated before an error is shown too
        self._raise_for(run_id, audits)
        return audits

    def _audit_live_batch(self, table: str, run_id: str, failures: list[str]) -> TableAudit:
        silver = self.layout.staged(table)
        stage = self.config.producing_stage(table)
        state = load_state(self.store, table)
        require_no_backfill_running(table, state)
        state, finished = self.intents.finish(table, state)
        audited = state.output_version
        if not self.engine.exists(silver):
            return TableAudit(table, run_id, (audited, audited), NOTHING_NEW)
        latest = self.engine.snapshot(silver).version
        last = state.last
        if latest == audited and last is not None and last.run_id == run_id:
            # A retry of a run whose audit completed: report the same outcome again.
            if finished is not None:
                return finished
            return TableAudit(
                table, run_id, last.versions, last.action, failures=list(last.failures)
            )
        if latest == audited and not failures:
            return TableAudit(table, run_id, (audited, latest), NOTHING_NEW)
        driver = self.drivers.driver(stage)
        consumed = driver.consumed_version()
        staged = live_batch(self.spark, self.engine, silver, audited, latest)
        # Tuples that were still pending at the last audit are accounted for now: emitted
        # in this batch, published by an earlier one, or still pending.
        pending_before = state.pending_version
        recorded_table = state.pending_table
        if pending_before is not None and (
            recorded_table is None or recorded_table != driver.pending_table()
        ):
            # Recorded by a release that kept H_S in its own table (its tuples were drained
            # before the upgrade: the SSBJ stage refuses older state with tuples pending), or
            # the stage's mode changed since: that version is not one of this driver's.
            logger.warning(
                "audit of %s: the pending tuples recorded at the last audit (v%s of %s) are "
                "not %s's; they are not accounted again",
                table,
                pending_before,
                recorded_table or "a table of an earlier release",
                driver.pending_table() or "a stage that keeps none",
            )
            pending_before = None
        id_column = self._id_column(table)
        input_from = state.input_version

        def views() -> dict[str, Rows]:
            tuples = self.inputs.new_rows(stage, input_from, consumed)
            waiting = driver.pending_at(pending_before) if pending_before is not None else None
            pending = driver.pending_ages(id_column)
            return {
                INPUT_VIEW: driver.input_accounting(tuples, waiting, id_column),
                PENDING_VIEW: pending if pending is not None else no_pending(tuples, id_column),
                PUBLISHED_VIEW: self.published.view(table, id_column, tuples, waiting),
            }

        pending_now = driver.pending_version()
        return self.intents.decide_and_commit(
            table,
            run_id,
            staged,
            (audited, latest),
            AuditViews(views, in_driver=self.engine.arrow_in_driver),
            failures,
            state,
            record=AuditRecord.of(consumed, pending_now, driver.pending_table()),
            rows=count_live_rows_added(self.engine, silver, audited, latest),
        )

    # ------------------------------------------------------------------ backfills

    def begin_backfill(self, run_id: str, start: datetime, end: datetime) -> None:
        """Record that a backfill of [start, end) is running, before it writes anything.

        Until :meth:`audit_backfill` completes, live audits of the outputs refuse to
        publish: the interval in ``silver`` may already be replaced while ``gold`` is not.
        An open live intent is finished first, so the backfill starts from a clean state.
        """
        for table in self.config.outputs():
            state = load_state(self.store, table)
            state, _ = self.intents.finish(table, state)
            state = state.with_backfill_running(run_id, start.isoformat(), end.isoformat())
            save_state(self.store, self.layout, table, state)

    def audit_backfill(self, run_id: str, start: datetime, end: datetime) -> list[TableAudit]:
        """Audit the replaced interval of every output and replace it in the published table."""
        audits: list[TableAudit] = []
        try:
            self._audit_backfill_tables(run_id, start, end, audits)
        finally:
            self.validation.update_docs()  # whatever was validated before an error is shown too
        self._raise_for(run_id, audits)
        return audits

    def _audit_backfill_tables(
        self, run_id: str, start: datetime, end: datetime, audits: list[TableAudit]
    ) -> None:
        """The backfill audit of each output in turn; each decision is appended to ``audits``."""
        in_interval = (F.col(INTERVAL_START) >= F.lit(start)) & (F.col(INTERVAL_START) < F.lit(end))
        quarantined: set[str] = set()
        for table in self.config.outputs():
            stage = self.config.producing_stage(table)
            silver = self.layout.staged(table)
            state = load_state(self.store, table)
            state, _ = self.intents.finish(table, state)
            if not self.engine.exists(silver):
                state = state.without("backfill_running")
                save_state(self.store, self.layout, table, state)
                continue
            # The backfill holds the pipeline lease, so the latest silver version is the
            # commit its replace of this table made.
            latest = self.engine.snapshot(silver).version
            staged = interval_batch(self.spark, self.engine, silver, latest, (start, end))
            input_table = self.layout.input_table(self.config, stage.input)
            input_rows = self.inputs.with_interval(stage, Rows.of(self.engine.read(input_table)))
            tuples = Rows.of(input_rows.to_spark().where(in_interval))
            id_column = self._id_column(table)
            accounting = self.drivers.driver(stage).input_accounting(tuples, None, id_column)
            views = AuditViews(
                functools.partial(
                    dict,
                    {
                        INPUT_VIEW: accounting,
                        PENDING_VIEW: no_pending(tuples, id_column),
                        PUBLISHED_VIEW: no_published(tuples, id_column),
                    },
                )
            )
            failures = []
            if stage.input in quarantined:
                failures.append(f"upstream table {stage.input} was quarantined in this run")
            audit = self.intents.decide_and_commit(
                table,
                run_id,
                staged,
                (state.output_version, latest),
                views,
                failures,
                state,
                record=AuditRecord(),
                interval=(start, end),
            )
            if audit.action == QUARANTINED:
                quarantined.add(table)
            audits.append(audit)

    # ------------------------------------------------------------------ resolution

    def unresolved(self) -> list[dict[str, Any]]:
        """Quarantined batches nobody has resolved yet, oldest first."""
        return [
            {"table": table, **entry.to_dict()}
            for table in self.config.outputs()
            for entry in load_state(self.store, table).unresolved()
        ]

    def resolve(self, table: str, run_id: str, publish: bool) -> int:
        """Mark a quarantined batch resolved; with ``publish``, publish its rows as they are.

        Returns the number of rows published. Idempotent: the publish commit carries an app
        transaction of its own per batch.
        """
        state = load_state(self.store, table)
        entries = [e for e in state.quarantined if e.run_id == run_id]
        if not entries:
            known = [e.run_id for e in state.quarantined]
            raise ConfigError(
                f"resolve: no quarantined batch of {table!r} from run {run_id!r}; "
                f"quarantined runs: {known}"
            )
        published = 0
        for entry in entries:
            if publish and not entry.resolved:
                batch_to = int(entry.batch[1])
                rows = (
                    self.engine.read(self.layout.quarantined_output(table))
                    .where((F.col(RUN_ID) == run_id) & (F.col(BATCH_TO) == batch_to))
                    .drop(RUN_ID, FAILED_EXPECTATIONS, QUARANTINED_AT, BATCH_TO)
                )
                outcome = publish_rows(
                    self.engine,
                    self.layout,
                    table,
                    rows,
                    AppTransaction(f"release.{table}.{batch_to}", 1),
                )
                published += outcome
        state = state.resolved(run_id, "published" if publish else "acknowledged")
        save_state(self.store, self.layout, table, state)
        logger.info("resolved quarantined batch(es) of %s from run %s", table, run_id)
        return published

    def unresolved_rows_arrow(self, table: str) -> pa.Table | None:
        """The root stream's id and ``_interval_start`` of the rows in ``table``'s
        quarantined batches nobody resolved yet (answered, not published), read in the
        driver's memory; None when there are none."""
        batches = [int(entry.batch[1]) for entry in load_state(self.store, table).unresolved()]
        path = self.layout.quarantined_output(table)
        if not batches or not self.engine.exists(path):
            return None
        id_column = self._id_column(table)
        rows = self.engine.read_arrow(
            self.engine.snapshot(path),
            columns=[id_column, INTERVAL_START, BATCH_TO],
            where=lambda rows: pc.is_in(rows.column(BATCH_TO), value_set=pa.array(batches)),
        )
        return rows.select([id_column, INTERVAL_START])

    def _id_column(self, table: str) -> str:
        return self.config.streams[self.config.root_stream(table)].id_column

    @staticmethod
    def _raise_for(run_id: str, audits: list[TableAudit]) -> None:
        failed = [a for a in audits if a.action == QUARANTINED]
        if failed:
            raise ValidationFailedError(
                f"run {run_id}: {len(failed)} output batch(es) failed their quality suites "
                "and were quarantined, not published: "
                + " | ".join(f"{a.table} ({a.rows} rows): {'; '.join(a.failures)}" for a in failed)
            )
