"""One batch's audit as an intent: validate, save the decision, commit it, record it.

Between the decision and its commit the audit saves its **intent** in the state store (the
batch bounds, the decision with its failures, the state it will record). Whatever runs
next for the table first finishes an open intent (:meth:`AuditIntents.finish`): it
re-reads exactly the batch, repeats the commit (skipped by its app transaction if it
landed) and records the state, so a batch is published at most once, and exactly once
when the audit completes.
"""

from __future__ import annotations

import logging
from datetime import datetime

from common.faults import crash_point
from pipeline.audit_batch import AuditViews, StagedBatch, TableAudit, interval_batch, live_batch
from pipeline.audit_publish import commit_decision
from pipeline.audit_state import AuditIntent, AuditRecord, AuditState, record_intent, save_state
from pipeline.audit_validation import AuditValidation
from pipeline.handles import PipelineHandles
from quality.batch_engine import choose_batch_engine

logger = logging.getLogger(__name__)


class AuditIntents:
    """Decides and commits an output table's batch through an intent, and finishes an
    intent a crash left open."""

    def __init__(self, handles: PipelineHandles, validation: AuditValidation) -> None:
        self.config, self.spark = handles.config, handles.spark
        self.engine, self.store, self.layout = handles.engine, handles.store, handles.layout
        self.validation = validation

    def decide_and_commit(
        self,
        table: str,
        run_id: str,
        staged: StagedBatch,
        batch: tuple[int, int],
        views: AuditViews,
        failures: list[str],
        state: AuditState,
        record: AuditRecord,
        interval: tuple[datetime, datetime] | None = None,
        rows: int | None = None,
    ) -> TableAudit:
        """Validate, write the intent, commit the decision, record the audit state.

        ``rows``: the batch's rows where the Delta log already says (else it is counted).

        Where a suite holds SQL expectations, the staged batch and the accounting views are
        cached for the duration: GX computes each SQL expectation twice (its rows and their
        count), and every view joins Delta reads that would otherwise be planned and scanned
        again each time (column metrics alone read the batch's files, projected, faster
        than caching them: :mod:`quality.batch_engine`). A small batch with
        engine-independent expectations is collected once and validated in memory instead
        (:mod:`quality.batch_engine`). Without suites nothing reads the batch: its rows come
        from the log and its files are added to gold as they are (``append_rows_added``).
        """
        quality = self.config.quality.get(table)
        suites = self.validation.suites(table, quality)
        expectations = [
            (e.expectation_type, e.configuration.kwargs) for s in suites for e in s.expectations
        ]
        engine = choose_batch_engine(
            expectations, rows, quality.in_memory_max_rows if quality is not None else 0
        )
        if suites:
            logger.info("audit %s: validated with GX on %s (%s)", table, engine.name, engine.reason)
        prepared = self.validation.prepare(table, staged, views, expectations, engine, rows)
        try:
            audit = self.validation.decide(table, run_id, prepared, batch, failures, suites)
            state = state.with_intent(
                AuditIntent(
                    run_id=run_id,
                    batch=list(batch),
                    action=audit.action,
                    rows=audit.rows,
                    failures=audit.failures,
                    interval=[t.isoformat() for t in interval] if interval else None,
                    record=record,
                    expectations_evaluated=sum(len(o.expectations) for o in audit.outcomes),
                    expectations_failed=sum(len(o.failures) for o in audit.outcomes),
                    stored_keys=AuditIntent.KEYS,
                )
            )
            save_state(self.store, self.layout, table, state)
            crash_point("audit.before_publish")
            commit_decision(self.engine, self.layout, table, audit, staged, interval)
            crash_point("audit.after_publish")
        finally:
            prepared.release()
        record_intent(self.store, self.layout, table, state)
        return audit

    def finish(self, table: str, state: AuditState) -> tuple[AuditState, TableAudit | None]:
        """Complete an audit whose decision was recorded but whose state was not: the
        state after it, and the audit finished (None: no intent was open)."""
        intent = state.intent
        if intent is None:
            return state, None
        batch = intent.versions
        interval: tuple[datetime, datetime] | None = None
        silver = self.layout.staged(table)
        if intent.interval:
            interval = (
                datetime.fromisoformat(intent.interval[0]),
                datetime.fromisoformat(intent.interval[1]),
            )
            staged = interval_batch(self.spark, self.engine, silver, batch[1], interval)
        else:
            staged = live_batch(self.spark, self.engine, silver, *batch)
        audit = TableAudit(
            table, intent.run_id, batch, intent.action, intent.rows, list(intent.failures)
        )
        logger.warning(
            "audit %s: finishing the interrupted audit of run %s, batch v%d..v%d (%s)",
            table,
            audit.run_id,
            batch[0] + 1,
            batch[1],
            audit.action,
        )
        commit_decision(self.engine, self.layout, table, audit, staged, interval)
        return record_intent(self.store, self.layout, table, state), audit
