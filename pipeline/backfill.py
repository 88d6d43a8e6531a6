"""Backfill: re-join one interval against the masters as of its end, then audit and publish it.

A backfill of ``[start, end)`` replaces the rows whose ``_interval_start`` lies in the
interval, in every output, with a fresh join of that interval's input rows against each
master as of ``end``. It runs in three steps, each restartable by running the same
backfill again:

1. **begin**: the publisher records the backfill as running on every output, before
   anything is written; until step 3 completes, live audits refuse to publish, because
   ``silver`` may hold the replaced interval while ``gold`` does not yet.
2. **re-join**: each stage's driver re-joins the interval and replaces it in the staged
   output in one commit, in config order, so a chained stage reads the replaced output of
   the stage before it. Live operator state (pending tuples, offsets) is not touched.
3. **audit**: the publisher validates each replaced interval and replaces it in the
   published table, or quarantines it, and clears the running mark.

Backfills hold the pipeline lease like every other command, so no live step interleaves.
"""

from __future__ import annotations

import logging
from datetime import datetime

from common.errors import ConfigError
from pipeline.audit import AuditPublisher
from pipeline.audit_batch import TableAudit
from pipeline.runner import PipelineRunner
from pipeline.stage_driver import StageReport

logger = logging.getLogger(__name__)


def rejoin_interval(
    runner: PipelineRunner, start: datetime, end: datetime, run_id: str
) -> list[StageReport]:
    """Step 2: every stage's driver replaces the interval in its staged output."""
    reports = []
    for stage in runner.config.stages:
        runner.progress(f"backfill {stage.name} [{start.isoformat()}, {end.isoformat()})")
        report = runner.driver(stage).backfill(start, end, run_id)
        runner.store.record_metrics(run_id, f"backfill.{stage.name}", 0, report.as_metrics())
        reports.append(report)
    return reports


def backfill(
    runner: PipelineRunner,
    publisher: AuditPublisher,
    start: datetime,
    end: datetime,
    run_id: str,
) -> list[TableAudit]:
    """The whole backfill of ``[start, end)``: begin, re-join, audit and publish.

    Raises :class:`~common.errors.ValidationFailedError` when a replaced interval is
    quarantined (the published table keeps its previous rows for that interval).
    """
    if start >= end:
        raise ConfigError(
            f"backfill: start {start.isoformat()} must be before end {end.isoformat()}"
        )
    publisher.begin_backfill(run_id, start, end)
    rejoin_interval(runner, start, end, run_id)
    audits = publisher.audit_backfill(run_id, start, end)
    logger.info(
        "backfill %s of [%s, %s): %s",
        run_id,
        start.isoformat(),
        end.isoformat(),
        ", ".join(f"{a.table} {a.action} ({a.rows} rows)" for a in audits) or "no outputs",
    )
    return audits
