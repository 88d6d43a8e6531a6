"""The commits an audit's decision makes: publish to gold, quarantine, or replace a
backfilled interval.

Each carries an app transaction of its own (``publish.<table>`` at the batch's last
version, ``quarantine.<table>``, ``release.<table>.<batch>`` for a resolved batch), so
repeating one after a crash commits nothing twice. A live batch is whole files of silver:
publishing adds them to gold as they are, reading and writing no rows.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.columns import INTERVAL_START
from pipeline.audit_batch import QUARANTINED, StagedBatch, TableAudit
from pipeline.layout import WarehouseLayout
from warehouse.delta import AppTransaction, DeltaEngine, PartitionFilter
from warehouse.delta.live_rows import append_live_rows_added

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
