"""One batch's audit as an intent: validate, save the decision, commit it, record it.

Between the decision and its commit the audit saves its **intent** in the state store (the
batch bounds, the decision with its failures, the state it will record). Whatever runs
next for the table first finishes an open intent (:meth:`AuditIntents.finish`): it
re-reads exactly the batch, repeats the commit (skipped by its app transaction if it
landed) and records the state, so a batch is published at most once, and exactly once
when the audit completes.

The commits a decision makes (:func:`commit_decision`): publish to gold, quarantine, or
replace a backfilled interval. Each carries an app transaction of its own
(``publish.<table>`` at the batch's last version, ``quarantine.<table>``,
``release.<table>.<batch>`` for a resolved batch), so repeating one after a crash commits
nothing twice. A live batch is whole files of silver: publishing adds them to gold as they
are, reading and writing no rows.
"""

from __future__ import annotations

import logging
from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.faults import crash_point
from joins.columns import INTERVAL_START
from pipeline.audit_batch import (
    QUARANTINED,
    AuditValidation,
    AuditViews,
    StagedBatch,
    TableAudit,
    interval_batch,
    live_batch,
)
from pipeline.audit_state import AuditIntent, AuditRecord, AuditState, record_intent, save_state
from pipeline.handles import PipelineHandles
from pipeline.layout import WarehouseLayout
from quality.batch_engine import choose_batch_engine
from warehouse.delta import AppTransaction, DeltaEngine, PartitionFilter
from warehouse.delta.live_rows import append_live_rows_added

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


RUN_ID, FAILED_EXPECTATIONS, QUARANTINED_AT = "_run_id", "_failed_expectations", "_quarantined_at"
BATCH_TO = "_batch_to"  # a quarantined row's batch: the silver version it was staged up to


def publish_rows(
    engine: DeltaEngine, layout: WarehouseLayout, table: str, rows: DataFrame, txn: AppTransaction
) -> int:
    """Append ``rows`` to ``table``'s published table under ``txn``; the rows added."""
    path = layout.published(table)
    outcome = engine.append(path, rows, txn, partition_by=(INTERVAL_START,))
    return outcome.rows_added


def quarantine(
    engine: DeltaEngine, layout: WarehouseLayout, audit: TableAudit, staged: DataFrame
) -> None:
    """Append a failed batch to its quarantine table, with the run, the batch and the
    failed expectations on every row."""
    rows = (
        staged.withColumn(RUN_ID, F.lit(audit.run_id))
        .withColumn(BATCH_TO, F.lit(audit.batch[1]).cast(T.LongType()))
        .withColumn(
            FAILED_EXPECTATIONS,
            F.array(*[F.lit(f) for f in audit.failures]).cast(T.ArrayType(T.StringType(), True)),
        )
        .withColumn(QUARANTINED_AT, F.current_timestamp())
    )
    path = layout.quarantined_output(audit.table)
    engine.append(
        path,
        rows,
        AppTransaction(f"quarantine.{audit.table}", audit.batch[1]),
        partition_by=(),
    )


def commit_decision(
    engine: DeltaEngine,
    layout: WarehouseLayout,
    table: str,
    audit: TableAudit,
    staged: StagedBatch,
    interval: tuple[datetime, datetime] | None,
) -> None:
    """Make ``audit``'s decision on ``staged``: quarantine it, replace the backfilled
    interval in gold, or add the live batch's files to gold."""
    txn = AppTransaction(f"publish.{table}", audit.batch[1])
    if audit.action == QUARANTINED:
        quarantine(engine, layout, audit, staged.frame())
    elif interval is not None:
        path = layout.published(table)
        where = [
            PartitionFilter(INTERVAL_START, ">=", interval[0]),
            PartitionFilter(INTERVAL_START, "<", interval[1]),
        ]
        rows = staged.frame()
        engine.create_table(path, rows.schema, (INTERVAL_START,))
        engine.replace(path, rows, where, txn)
    elif audit.rows:
        # The live batch is whole files of silver: they are added to gold as they are.
        append_live_rows_added(
            engine,
            layout.staged(table),
            *audit.batch,
            layout.published(table),
            txn,
            partition_by=(INTERVAL_START,),
        )
