"""The driver of an equi stage in ``baseline`` mode (:class:`EquiBaselineDriver`): Spark
joins each batch to the master snapshot, the exactly-once step of
:class:`~pipeline.stateless_driver.StatelessDriver`.

With ``operator.late_master``, tuples without a master row wait in the stage's late table
for later master versions (:mod:`pipeline.waiting_tuples`).
"""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from common.faults import crash_point
from common.rows import Frame, Rows
from joins import baseline
from joins.columns import MATCHED
from pipeline.emission import equi_input_accounting, master_keys
from pipeline.late_table import LATE_COLUMNS, LATE_SINCE, late_table
from pipeline.pins import PinHolder
from pipeline.stage_config import EquiStage
from pipeline.stage_driver import StageReport
from pipeline.stateless_driver import StatelessDriver, StepBatch, without_tuples
from pipeline.waiting_tuples import (
    answered,
    nothing_to_do,
    plan_late_step,
    probe_rows,
    record_waiting,
    saved_state,
    still_waiting,
    waiting_ages,
    waiting_records,
)
from pipeline.waiting_tuples import counts as late_counts
from warehouse.delta import AppTransaction, Snapshot
from warehouse.delta.live_rows import table_rows

logger = logging.getLogger(__name__)


# A batch this many times smaller than the master (rows) is joined to the master rows of
# its keys only. At 40x (20k tuples, TPC-H SF1 partsupp) the join and write took 0.42 s
# instead of 0.65 s; at 4x (200k tuples) the two were even (BENCHMARKS.md, section 1).
PREFILTER_MASTER_BATCHES = 8


def prefilters(batch_rows: int | None, master_rows: int | None) -> bool:
    """Whether a batch of ``batch_rows`` joins a master of ``master_rows`` through the
    master rows of its keys (``joins.baseline.equi_join_flagged``'s ``prefilter``); not
    when either count is unknown."""
    if batch_rows is None or master_rows is None:
        return False
    return master_rows >= PREFILTER_MASTER_BATCHES * max(batch_rows, 1)


class EquiBaselineDriver(StatelessDriver[EquiStage]):
    """An equi stage in ``baseline`` mode: Spark joins each batch to the master snapshot.

    With ``operator.late_master``, tuples without a master row wait in the stage's late
    table for later master versions (:mod:`pipeline.waiting_tuples`); the audit sees them as
    the stage's pending tuples."""

    @property
    def late_path(self) -> str:
        return late_table(self.layout, self.stage.name)

    def _wait(self) -> timedelta:
        late = self.stage.operator.late_master
        return late.wait_delta if late is not None else timedelta(0)

    def _keeps_late(self) -> bool:
        return self.stage.operator.late_master is not None or self.engine.exists(self.late_path)

    def has_waiting(self) -> bool:
        """Tuples wait, or a step planned for them is not recorded done: a rerun after a
        crash must finish that step (its writes are skipped, its offset recorded) even if
        it emptied the late table, or the next step would reuse its number."""
        next_step = self.store.offset(self.stage.name).step_seq + 1
        planned, oldest = saved_state(self.store, self.stage.name)
        if planned is not None and planned.step == next_step:
            return True
        if waiting_records(self.engine, self.late_path) == 0:
            return False
        # Without new input a step can only answer a waiting tuple from a newer master
        # version, or expire one: otherwise it would rewrite the late table unchanged.
        master = self.engine.snapshot(self.inputs.master_path(self.stage)).version
        return not nothing_to_do(planned, master, oldest, self._wait(), datetime.now(UTC))

    def pending_table(self) -> str | None:
        return self.late_path if self._keeps_late() else None

    def backfilled(self, rows: DataFrame) -> DataFrame:
        """Without the tuples that wait for late master rows: the live steps still answer
        them, once (re-joined here too, a left join would emit them unmatched now and
        answered later). Matched on every input column, null-safely."""
        if not self.engine.exists(self.late_path):
            return rows
        return without_tuples(rows, self.engine.read(self.late_path).drop(*LATE_COLUMNS))

    def pending_version(self) -> int | None:
        if not self.engine.exists(self.late_path):
            return None
        return self.engine.snapshot(self.late_path).version

    def pending_at(self, version: int) -> Rows:
        return Rows.apply(_without_late_columns, table_rows(self.engine, self.late_path, version))

    def pending_ages(self, id_column: str) -> Rows | None:
        if not self.engine.exists(self.late_path):
            return None
        late = table_rows(self.engine, self.late_path, columns=[id_column, LATE_SINCE])
        return waiting_ages(
            late,
            id_column,
            self._wait(),
            self.inputs.config.schedule.interval_delta,
            datetime.now(UTC),
        )

    def _late_join_and_write(
        self, rows: DataFrame, master: Snapshot, report: StageReport, txn: AppTransaction
    ) -> None:
        """A step with tuples that may wait: the new and the waiting tuples against
        ``master``; answered rows appended, the still-waiting ones the late table's next
        content (module :mod:`pipeline.waiting_tuples`)."""
        stage, wait = self.stage, self._wait()
        exists = self.engine.exists(self.late_path)
        plan = plan_late_step(
            self.store,
            stage.name,
            txn.version,
            self.engine.snapshot(self.late_path).version if exists else None,
            master.version,
            datetime.now(UTC),
        )
        holder = PinHolder.LATE.of(stage.name)
        if plan.late_version is not None:
            self.store.set_pins(holder, {self.late_path: [plan.late_version]})
        late = (
            self.engine.read(self.late_path, version=plan.late_version)
            if plan.late_version is not None
            else None
        )
        probe = probe_rows(rows, late, plan)
        joined = self.join(probe, master).cache()
        try:
            counted = late_counts(joined, plan, wait)
            self._write_output(
                baseline.finish(answered(joined, plan, wait), stage.join), txn, report
            )
            crash_point("late.after_output")
            waiting = still_waiting(joined, plan, wait, probe.columns)
            self.engine.create_table(self.late_path, waiting.schema)
            outcome = self.engine.overwrite(
                self.late_path, waiting, AppTransaction(f"late.{stage.name}", txn.version)
            )
        finally:
            joined.unpersist()
        record_waiting(self.store, stage.name, plan, counted["oldest_us"])
        # The version this step read stays pinned beside the new one until the next step's
        # plan: a rerun of this step (a crash before its offset is recorded) reads it again.
        kept = [v for v in (plan.late_version, outcome.table_version) if v is not None]
        self.store.set_pins(holder, {self.late_path: kept})
        # The conservation view counts the step's new tuples: matched now, expired now
        # (wait zero) or waiting; answers to earlier tuples are extra output rows.
        report.tuples_in = counted["new"]
        report.tuples_matched = counted["new_matched"]
        report.tuples_unmatched = counted["new_expired"]
        report.tuples_pending = counted["new_waiting"]
        report.output_rows = counted["match_rows"] + (
            counted["expired"] if stage.join == "left" else 0
        )
        report.extra["late_waiting"] = counted["waiting"]
        report.extra["late_answered"] = counted["late_answered"]
        report.extra["late_expired"] = counted["late_expired"]
        logger.info(
            "stage %s step %d: %d tuple(s) wait for late master rows (up to %s), %d waiting "
            "tuple(s) answered from master v%d, %d expired",
            stage.name,
            txn.version,
            counted["waiting"],
            stage.operator.late_master.wait if stage.operator.late_master else "0s",
            counted["late_answered"],
            master.version,
            counted["late_expired"],
        )

    def join(self, rows: DataFrame, master: Snapshot, batch_rows: int | None = None) -> DataFrame:
        """The flagged join of ``rows`` to ``master``; a batch of ``batch_rows`` (when
        known) much smaller than the master is joined to the master rows of its keys only
        (:func:`prefilters`)."""
        stream, master_rows = self._stream_and_master(rows, master)
        return baseline.equi_join_flagged(
            stream,
            master_rows,
            self.stage.join_on,
            self.stage.master,
            master.version,
            prefilter=prefilters(batch_rows, master.num_records),
        )

    def join_step(self, step: StepBatch) -> DataFrame:
        return self.join(step.rows, step.master, step.tuples_in)

    def join_and_write(self, step: StepBatch) -> None:
        """One Spark job: the write, with the counts observed as the rows pass.

        With ``tuples_in`` known from the log, only the join's output is observed
        (``StatelessDriver.join_and_write``), and a small batch is prefiltered
        (:meth:`join_step`). Otherwise the stream is observed as it enters the join (the
        tuples in) and the flagged join as it leaves it, before the inner join's filter
        (rows of matches, and the unmatched tuples, each of which a flagged join emits
        once). A matched tuple is one that is not unmatched. A stage with tuples that may
        wait for late master rows joins them too (:meth:`_late_join_and_write`).
        """
        rows, master, report, txn = step.rows, step.master, step.report, step.txn
        if self._keeps_late():
            self._late_join_and_write(rows, master, report, txn)
            return
        if step.tuples_in is not None:
            super().join_and_write(step)
            return
        # Unique names: a retry of the step in this session observes afresh.
        tag = f"{txn.app_id}.{txn.version}.{uuid.uuid4().hex[:8]}"
        stream_in, joined_out = Observation(f"{tag}.in"), Observation(f"{tag}.out")
        observed = rows.observe(stream_in, F.count(F.lit(1)).alias("tuples"))
        joined = self.join(observed, master).observe(
            joined_out,
            F.sum(F.col(MATCHED).cast("long")).alias("match_rows"),
            F.sum((~F.col(MATCHED)).cast("long")).alias("unmatched"),
        )
        self._write_output(baseline.finish(joined, self._stage.join), txn, report)
        if not report.committed:
            # The commit landed before a crash, so no write job ran now and nothing was
            # observed: the rows are joined and counted again.
            self._count(self.join(rows, master), report)
            return
        out = joined_out.get
        self._set_counts(
            report,
            int(stream_in.get["tuples"]),
            int(out["unmatched"] or 0),
            int(out["match_rows"] or 0),
        )

    def input_accounting(self, tuples: Rows, waiting: Rows | None, id_column: str) -> Rows:
        master = self.inputs.master_path(self.stage)
        keys = master_keys(self.stage, self.engine, master, tuples)
        return equi_input_accounting(self.stage, keys, tuples, waiting, id_column)


def _without_late_columns(late: Frame) -> Frame:
    """A late table's rows as the stream tuples they are."""
    return late.drop(*LATE_COLUMNS)
