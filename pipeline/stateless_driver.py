"""The base of the stage drivers whose join keeps no tuples in an operator state:
:class:`StatelessDriver`, whose subclasses say how a step's rows are joined. They are the
driver of an equi stage in ``baseline`` mode (``pipeline.baseline_driver``) and of every
theta stage (``pipeline.theta_driver``).

Every step is exactly-once:

1. ``plan_step`` fixes the step's input range (offset -> latest input version) and master
   version in the state store before anything is written.
2. The output is appended with the app transaction ``stage.<name>`` at the step's sequence
   number, so a rerun of a step whose commit already landed writes nothing.
3. ``set_offset`` then records the step as done.

A crash between 2 and 3 reruns the same planned step, whose commit is skipped.
"""

from __future__ import annotations

import logging
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from common.faults import crash_point
from common.rows import Rows
from joins import baseline
from joins.columns import INTERVAL_START, MATCHED, ROW_ID, require_disjoint
from pipeline.layout import WarehouseLayout
from pipeline.pins import PinHolder, input_versions, union_pins
from pipeline.stage_config import EquiStage, ThetaStage
from pipeline.stage_driver import StageReport, StepMetrics
from pipeline.stage_inputs import StageInputs
from warehouse.delta import AppTransaction, DeltaEngine, PartitionFilter, Snapshot
from warehouse.delta.api import BACKFILL
from warehouse.delta.live_rows import count_live_rows_added, operation
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)

StageT = TypeVar("StageT", EquiStage, ThetaStage)


@dataclass(frozen=True)
class StepBatch:
    """The work of one scheduled step: the stage input's new ``rows`` (with
    ``_interval_start``), the ``master`` snapshot they join, the run, the step's report,
    its commit's app transaction, and how many tuples ``rows`` holds when the Delta log
    tells without a job (``tuples_in``)."""

    rows: DataFrame
    master: Snapshot
    run_id: str
    report: StageReport
    txn: AppTransaction
    tuples_in: int | None = None


class StatelessDriver(ABC, Generic[StageT]):
    """Joins each step's new input rows with the master version planned for the step;
    subclasses say how (:meth:`join`)."""

    def __init__(
        self,
        stage: StageT,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        inputs: StageInputs,
    ) -> None:
        self._stage: StageT = stage
        self.spark = spark
        self.engine = engine
        self.store = store
        self.inputs = inputs
        self.layout: WarehouseLayout = inputs.layout

    @property
    def stage(self) -> StageT:
        return self._stage

    # ------------------------------------------------------------------ StageDriver

    def step(self, run_id: str, steps: int | None = None, close: bool = True) -> StageReport:
        """One step joins everything that arrived; ``steps`` and ``close`` do not apply."""
        stage = self._stage
        started = time.monotonic()
        input_path = self.inputs.input_path(stage)
        master_path = self.inputs.master_path(stage)
        offset = self.store.offset(stage.name)
        if not self.engine.exists(input_path):
            logger.info("stage %s: input %s does not exist yet", stage.name, input_path)
            return StageReport(stage.name, step=offset.step_seq)
        latest_input = self.engine.snapshot(input_path).version
        latest_master = self.engine.snapshot(master_path).version
        # Pin what the step reads before it is planned (holder stage.<name>): exactly the
        # versions plan_step returns, an earlier attempt's plan if one is open.
        planned_to: int = latest_input
        planned_master: int = latest_master
        if offset.planned_input_version is not None and offset.planned_master_version is not None:
            planned_to, planned_master = offset.planned_input_version, offset.planned_master_version
        holder = PinHolder.STAGE.of(stage.name)
        consumed: int = offset.input_version
        reads: list[int] = [consumed, *input_versions(consumed, planned_to)]
        self.store.set_pins(holder, union_pins({master_path: [planned_master], input_path: reads}))
        plan = self.store.plan_step(stage.name, latest_input, latest_master)
        assert plan.planned_input_version is not None and plan.planned_master_version is not None
        step = offset.step_seq + 1
        report = StageReport(stage.name, step=step, master_version=plan.planned_master_version)
        if plan.planned_input_version <= offset.input_version and not self.has_waiting():
            self.store.set_offset(stage.name, offset.input_version, offset.step_seq)
            self.store.set_pins(holder, union_pins({input_path: [offset.input_version]}))
            logger.info("stage %s: no new input since version %d", stage.name, offset.input_version)
            report.step = offset.step_seq
            return report
        new_rows = self.inputs.new_rows(
            stage, offset.input_version, plan.planned_input_version
        ).to_spark()
        master = self.engine.snapshot(master_path, plan.planned_master_version)
        report.master_bytes_read = master.size_bytes
        self.join_and_write(
            StepBatch(
                new_rows,
                master,
                run_id,
                report,
                AppTransaction(f"stage.{stage.name}", step),
                count_live_rows_added(
                    self.engine, input_path, offset.input_version, plan.planned_input_version
                ),
            )
        )
        crash_point("stage.after_output_commit")
        self.store.set_offset(stage.name, plan.planned_input_version, step)
        # Still pinned: the consumed version, after which the next step follows the input.
        self.store.set_pins(holder, union_pins({input_path: [plan.planned_input_version]}))
        report.seconds = time.monotonic() - started
        report.steps.append(StepMetrics(step, report.as_metrics()))
        logger.info(
            "stage %s step %d: %d tuple(s) in, %d row(s) out (%d matched, %d unmatched) "
            "against master v%d in %.1fs",
            stage.name,
            step,
            report.tuples_in,
            report.output_rows,
            report.tuples_matched,
            report.tuples_unmatched,
            master.version,
            report.seconds,
        )
        return report

    def drain(self, run_id: str) -> StageReport:
        """Nothing is held back between steps: a drain is one step (tuples waiting for late
        master rows wait on: their wait is a promise in time, not in steps)."""
        return self.step(run_id)

    def has_waiting(self) -> bool:
        """Whether tuples wait for a step even without new input (late master rows)."""
        return False

    def backfilled(self, rows: DataFrame) -> DataFrame:
        """The input rows of an interval a backfill re-joins (all of them, here)."""
        return rows

    def backfill(self, start: datetime, end: datetime, run_id: str) -> StageReport:
        return self.replace_interval(start, end)[0]

    def replace_interval(self, start: datetime, end: datetime) -> tuple[StageReport, int]:
        """The backfill of [start, end), and the input version whose rows it re-joined."""
        stage = self._stage
        started = time.monotonic()
        where = [
            PartitionFilter(INTERVAL_START, ">=", start),
            PartitionFilter(INTERVAL_START, "<", end),
        ]
        master = self._master_as_of(self.inputs.master_path(stage), end)
        input_snapshot = self.engine.snapshot(self.inputs.input_path(stage))
        read = Rows.of(self.engine.read_files(input_snapshot))
        rows = (
            self.inputs.with_interval(stage, read)
            .to_spark()
            .where((F.col(INTERVAL_START) >= F.lit(start)) & (F.col(INTERVAL_START) < F.lit(end)))
        )
        joined = self.join(self.backfilled(rows), master).cache()
        try:
            report = StageReport(stage.name, master_version=master.version)
            self._count(joined, report)
            output = baseline.finish(joined, stage.join)
            path = self.layout.staged(stage.output)
            self.engine.create_table(path, output.schema, (INTERVAL_START,))
            with operation(self.engine, BACKFILL):
                outcome = self.engine.replace(path, output, where)
            report.committed = outcome.committed
        finally:
            joined.unpersist()
        report.seconds = time.monotonic() - started
        return report, input_snapshot.version

    def work_due(self) -> bool:
        # A stateless step holds no tuples between steps. The plain join's late tuples
        # are re-checked at its next step: when input lands, or at the scheduled run.
        return False

    def consumed_version(self) -> int:
        return self.store.offset(self.stage.name).input_version

    def pending_table(self) -> str | None:
        return None

    def pending_version(self) -> int | None:
        return None

    def pending_at(self, version: int) -> Rows:
        raise ValueError(f"stage {self._stage.name} keeps no pending tuples (asked for v{version})")

    def pending_ages(self, id_column: str) -> Rows | None:
        return None

    @abstractmethod
    def input_accounting(self, tuples: Rows, waiting: Rows | None, id_column: str) -> Rows:
        """Which tuples this stage's join must emit rows for (``pipeline.emission``)."""

    # ------------------------------------------------------------------ the join

    @abstractmethod
    def join(self, rows: DataFrame, master: Snapshot) -> DataFrame:
        """Matches flagged, unmatched stream rows once with nulls (``baseline.finish``
        makes the output of it); ``rows`` carry ``_interval_start``."""

    def join_step(self, step: StepBatch) -> DataFrame:
        """The join of a scheduled step (a driver may keep structures between steps)."""
        return self.join(step.rows, step.master)

    def join_and_write(self, step: StepBatch) -> None:
        """Join a step's rows, count them into its report and append the output.

        ``tuples_in`` is how many rows ``rows`` holds when the Delta log tells
        (:func:`count_live_rows_added`). Then the step is one Spark job: the write, with the
        output observed as it passes. Every flagged join emits each unmatched tuple once
        (``join``), so the rows of matches and the unmatched tuples are sums over the
        output, and the matched tuples are the others. The input cannot be observed
        instead: a join may run jobs of its own over the rows first (statistics, samples,
        a layout), which would fill the observation. Without ``tuples_in`` the joined rows
        are cached, counted, then written.
        """
        report, txn, tuples_in = step.report, step.txn, step.tuples_in
        if tuples_in is not None:
            tag = f"{txn.app_id}.{txn.version}.{uuid.uuid4().hex[:8]}"
            joined_out = Observation(f"{tag}.out")
            joined = self.join_step(step).observe(
                joined_out,
                F.sum(F.col(MATCHED).cast("long")).alias("match_rows"),
                F.sum((~F.col(MATCHED)).cast("long")).alias("unmatched"),
            )
            self._write_output(baseline.finish(joined, self._stage.join), txn, report)
            if report.committed:
                out = joined_out.get
                unmatched, match_rows = int(out["unmatched"] or 0), int(out["match_rows"] or 0)
                if 0 <= tuples_in - unmatched <= match_rows:
                    self._set_counts(report, tuples_in, unmatched, match_rows)
                    return
                logger.warning(
                    "stage %s: %d tuple(s) in but %d unmatched and %d row(s) of matches "
                    "observed; counting the joined rows instead",
                    self._stage.name,
                    tuples_in,
                    unmatched,
                    match_rows,
                )
            # The commit landed before a crash (no write job ran now, nothing observed),
            # or the sums do not add up: the rows are joined and counted again.
            self._count(self.join(step.rows, step.master), report)
            return
        joined = self.join_step(step).cache()
        try:
            self._count(joined, report)
            self._write_output(baseline.finish(joined, self._stage.join), txn, report)
        finally:
            joined.unpersist()

    def _stream_and_master(self, rows: DataFrame, master: Snapshot) -> tuple[DataFrame, DataFrame]:
        stream = rows.withColumn(ROW_ID, F.monotonically_increasing_id())
        master_rows = self.inputs.master_rows(self.stage, master)
        require_disjoint(stream, master_rows, self.stage.name)
        return stream, master_rows

    def _count(self, joined: DataFrame, report: StageReport) -> None:
        row = joined.agg(
            F.count_distinct(ROW_ID).alias("tuples"),
            F.count_distinct(F.when(F.col(MATCHED), F.col(ROW_ID))).alias("matched"),
            F.sum(F.col(MATCHED).cast("int")).alias("match_rows"),
        ).first()
        assert row is not None
        tuples = int(row["tuples"])
        self._set_counts(report, tuples, tuples - int(row["matched"]), int(row["match_rows"] or 0))

    def _set_counts(
        self, report: StageReport, tuples: int, unmatched: int, match_rows: int
    ) -> None:
        """A step's counts from its tuples in, unmatched tuples and rows of matches: a left
        join also emits each unmatched tuple once."""
        report.tuples_in = tuples
        report.tuples_unmatched = unmatched
        report.tuples_matched = tuples - unmatched
        report.output_rows = match_rows + (unmatched if self._stage.join == "left" else 0)

    def _write_output(self, output: DataFrame, txn: AppTransaction, report: StageReport) -> None:
        path = self.layout.staged(self._stage.output)
        outcome = self.engine.append(path, output, txn, partition_by=(INTERVAL_START,))
        report.committed = outcome.committed
        if outcome.committed:
            report.extra["output_version"] = outcome.table_version

    def _master_as_of(self, path: str, moment: datetime) -> Snapshot:
        """The master version in force at ``moment``.

        A master first committed after ``moment`` (replayed or late-loaded data) has no such
        version; the latest one is used then, with a warning, as a live run would.
        """
        moment_ms = moment.timestamp() * 1000
        in_force = [
            int(h["version"])
            for h in self.engine.history(path)
            if h.get("timestamp") is not None and float(h["timestamp"]) <= moment_ms
        ]
        if in_force:
            return self.engine.snapshot(path, version=max(in_force))
        latest = self.engine.snapshot(path)
        logger.warning(
            "master %s has no version as of %s; backfill uses its latest version %d",
            path,
            moment,
            latest.version,
        )
        return latest


def without_tuples(rows: DataFrame, tuples: DataFrame) -> DataFrame:
    """``rows`` without those equal to one of ``tuples`` on every column the two share,
    null-safely (a backfill leaves tuples that wait for late master rows to the live
    steps)."""
    shared = [c for c in tuples.columns if c in rows.columns]
    if not shared:
        raise ValueError(f"no column in common between {rows.columns} and {tuples.columns}")
    same = [rows[c].eqNullSafe(tuples[c]) for c in shared]
    condition = same[0]
    for term in same[1:]:
        condition = condition & term
    return rows.join(tuples.select(*shared), condition, "left_anti")
