"""The pipeline runner: ingest, one step of every stage, drain, backfill, status.

Every stage step is exactly-once:

1. ``plan_step`` fixes the step's input range (offset → latest input version) and master
   version in the state store before anything is written.
2. The output is appended with the app transaction ``stage.<name>`` at the step's sequence
   number, so a rerun of a step whose commit already landed writes nothing.
3. ``set_offset`` then records the step as done.

A crash between 2 and 3 reruns the same planned step, whose commit is skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from common.errors import ConfigError
from common.faults import crash_point
from joins import baseline
from joins.adsp import adsp_join_flagged
from joins.columns import (
    INTERVAL_START,
    MATCHED,
    ROW_ID,
    require_disjoint,
    with_interval_start,
)
from joins.ssbj import INPUT_VERSION
from joins.theta_stats import theta_plan
from pipeline.config import EquiStage, PipelineConfig, ThetaStage
from pipeline.layout import WarehouseLayout
from pipeline.pins import input_versions, stage_holder, union_pins
from pipeline.row_bytes import measured_row_bytes
from pipeline.schemas import QUARANTINE_SCHEMA, bronze_schema, declared_schema
from pipeline.ssbj_stage import SsbjStage
from pipeline.theta_stage import AdspLayoutStage
from warehouse.delta import AppTransaction, DeltaEngine, PartitionFilter, Snapshot
from warehouse.delta.api import BACKFILL, live_rows_added, operation
from warehouse.delta.embedded import COMMIT_VERSION
from warehouse.landing import IngestReport, StreamSource, ingest_stream
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)


@dataclass
class StageReport:
    stage: str
    step: int = 0
    tuples_in: int = 0
    output_rows: int = 0
    tuples_matched: int = 0
    tuples_unmatched: int = 0
    tuples_pending: int = 0
    master_version: int | None = None
    master_bytes_read: int = 0
    seconds: float = 0.0
    committed: bool = False
    extra: dict[str, float] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        return {
            "tuples_in": self.tuples_in,
            "output_rows": self.output_rows,
            "tuples_matched": self.tuples_matched,
            "tuples_unmatched": self.tuples_unmatched,
            "tuples_pending": self.tuples_pending,
            "master_version": float(self.master_version or 0),
            "master_bytes_read": self.master_bytes_read,
            "step_seconds": self.seconds,
            **self.extra,
        }


class PipelineRunner:
    """Runs the work a config declares against one warehouse and one state store."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.spark = spark
        self.engine = engine
        self.store = store
        self.layout = WarehouseLayout.of(config)
        self._progress = progress or (lambda message: logger.info("%s", message))

    # ------------------------------------------------------------------ ingestion

    def stream_source(self, name: str) -> StreamSource:
        stream = self.config.streams[name]
        return StreamSource(
            name=name,
            landing_dir=Path(stream.landing),
            format=stream.format,
            schema=declared_schema(stream.columns),
            required=tuple(c.name for c in stream.columns if not c.nullable),
            bronze_path=self.layout.bronze(name),
            quarantine_path=self.layout.quarantine(name),
            bronze_schema=bronze_schema(stream),
            quarantine_schema=QUARANTINE_SCHEMA,
            csv_header=stream.csv_header,
            csv_delimiter=stream.csv_delimiter,
        )

    def ingest(self, run_id: str) -> list[IngestReport]:
        reports = []
        for name in self.config.streams:
            self._progress(f"ingest {name}")
            report = ingest_stream(
                self.spark, self.engine, self.store, self.stream_source(name), run_id
            )
            self.store.record_metrics(run_id, f"ingest.{name}", 0, report.as_metrics())
            reports.append(report)
        return reports

    # ------------------------------------------------------------------ stages

    def run_stages(self, run_id: str) -> list[StageReport]:
        reports = []
        for index, stage in enumerate(self.config.stages, start=1):
            self._progress(f"stage {index}/{len(self.config.stages)}: {stage.name}")
            report = self.run_stage_step(stage, run_id)
            reports.append(report)
        return reports

    def run_stage_step(self, stage: EquiStage | ThetaStage, run_id: str) -> StageReport:
        if isinstance(stage, EquiStage) and stage.operator.mode != "baseline":
            return self._run_ssbj(stage, run_id, drain=False)
        started = time.monotonic()
        input_path = self.layout.input_table(self.config, stage.input)
        master_path = self.layout.master(self.config, stage.master)
        offset = self.store.offset(stage.name)
        if not self.engine.exists(input_path):
            logger.info("stage %s: input %s does not exist yet", stage.name, input_path)
            return StageReport(stage.name, step=offset.step_seq)
        latest_input = self.engine.snapshot(input_path).version
        latest_master = self.engine.snapshot(master_path).version
        # Pin what the step reads before it is planned (holder stage.<name>): exactly the
        # versions plan_step returns, an earlier attempt's plan if one is open.
        planned_to, planned_master = latest_input, latest_master
        if offset.planned_input_version is not None and offset.planned_master_version is not None:
            planned_to, planned_master = offset.planned_input_version, offset.planned_master_version
        holder = stage_holder(stage.name)
        self.store.set_pins(
            holder,
            union_pins(
                {
                    master_path: [planned_master],
                    input_path: input_versions(offset.input_version, planned_to),
                }
            ),
        )
        plan = self.store.plan_step(stage.name, latest_input, latest_master)
        assert plan.planned_input_version is not None and plan.planned_master_version is not None
        step = offset.step_seq + 1
        report = StageReport(stage.name, step=step, master_version=plan.planned_master_version)
        if plan.planned_input_version <= offset.input_version:
            self.store.set_offset(stage.name, offset.input_version, offset.step_seq)
            self.store.set_pins(holder, {})
            logger.info("stage %s: no new input since version %d", stage.name, offset.input_version)
            report.step = offset.step_seq
            return report
        new_rows = self.new_rows(input_path, offset.input_version, plan.planned_input_version)
        master = self.engine.snapshot(master_path, plan.planned_master_version)
        if isinstance(stage, ThetaStage) and stage.operator.uses_layout:
            joined = self._join_with_layout(stage, new_rows, master, run_id, report).cache()
        else:
            joined = self._join(stage, new_rows, master).cache()
        try:
            output = baseline.finish(joined, stage.join)
            self._count(joined, report)
            report.master_bytes_read = master.size_bytes
            self._write_output(stage, output, AppTransaction(f"stage.{stage.name}", step), report)
        finally:
            joined.unpersist()
        crash_point("stage.after_output_commit")
        self.store.set_offset(stage.name, plan.planned_input_version, step)
        self.store.set_pins(holder, {})
        report.seconds = time.monotonic() - started
        self.store.record_metrics(run_id, stage.name, step, report.as_metrics())
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

    def ssbj_stage(self, stage: EquiStage) -> SsbjStage:
        input_path = self.layout.input_table(self.config, stage.input)

        def input_rows(after_version: int, to_version: int) -> DataFrame:
            rows = live_rows_added(self.engine, input_path, after_version, to_version)
            return self.stream_rows(stage, rows.withColumnRenamed(COMMIT_VERSION, INPUT_VERSION))

        return SsbjStage(
            stage,
            self.config,
            self.spark,
            self.engine,
            self.store,
            input_rows,
            output_path=self.layout.output(stage.output),
            input_path=input_path,
        )

    def _run_ssbj(self, stage: EquiStage, run_id: str, drain: bool) -> StageReport:
        if not self.engine.exists(self.layout.input_table(self.config, stage.input)):
            return StageReport(stage.name)
        steps = self.ssbj_stage(stage).run(run_id, drain=drain)
        report = StageReport(
            stage.name,
            step=steps[-1].step + 1 if steps else self.store.offset(stage.name).step_seq,
        )
        for step in steps:
            report.tuples_in += step.tuples_in
            report.output_rows += step.output_rows
            report.tuples_pending = step.pending_rows
            report.master_bytes_read += step.master_bytes_read
            report.seconds += step.seconds
        return report

    def new_rows(self, input_path: str, after_version: int, to_version: int) -> DataFrame:
        """Input rows a live step has not consumed (see :func:`live_rows_added`)."""
        return live_rows_added(self.engine, input_path, after_version, to_version).drop(
            COMMIT_VERSION
        )

    def stream_rows(self, stage: EquiStage | ThetaStage, rows: DataFrame) -> DataFrame:
        root = self.config.root_stream(stage.input)
        interval = int(self.config.schedule.interval_delta.total_seconds())
        return with_interval_start(rows, self.config.streams[root].event_time, interval)

    def _master_frame(self, stage: EquiStage | ThetaStage, master: Snapshot) -> DataFrame:
        columns = self.config.masters[stage.master].columns
        missing = [c for c in columns if c not in master.schema.fieldNames()]
        if missing:
            raise ConfigError(
                f"masters.{stage.master}.columns: {missing} are not columns of "
                f"{master.table_path} (it has {master.schema.fieldNames()})"
            )
        return self.engine.read_files(master).select(*columns)

    def _join(self, stage: EquiStage | ThetaStage, rows: DataFrame, master: Snapshot) -> DataFrame:
        stream = self.stream_rows(stage, rows).withColumn(ROW_ID, F.monotonically_increasing_id())
        master_rows = self._master_frame(stage, master)
        require_disjoint(stream, master_rows, stage.name)
        if isinstance(stage, EquiStage):
            return baseline.equi_join_flagged(
                stream, master_rows, stage.join_on, stage.master, master.version
            )
        scheme = stage.operator.scheme
        if scheme == "spark":
            return baseline.theta_join_flagged(
                stream, master_rows, stage.predicate, stage.master, master.version
            )
        if scheme == "binning":
            return baseline.binned_band_join_flagged(
                stream, master_rows, stage.predicate, stage.master, master.version
            )
        plan = theta_plan(
            stream,
            master_rows,
            stage.predicate,
            stage.operator.task_memory_bytes,
            scheme,
            stream_row_bytes=measured_row_bytes(stream) or 1.0,
            master_row_bytes=measured_row_bytes(master_rows) or 1.0,
        )
        logger.info(
            "theta stage %s: %s plan with %d area(s), %d task(s)",
            stage.name,
            scheme,
            len(plan.areas),
            plan.tasks,
        )
        return adsp_join_flagged(
            self.spark,
            stream,
            master_rows,
            stage.predicate,
            plan,
            stage.master,
            master.version,
            ROW_ID,
        )

    def theta_layout(self, stage: ThetaStage) -> AdspLayoutStage:
        return AdspLayoutStage(
            stage,
            self.spark,
            self.engine,
            self.store,
            self.layout.operator_state(stage.name, "layout"),
        )

    def _join_with_layout(
        self,
        stage: ThetaStage,
        rows: DataFrame,
        master: Snapshot,
        run_id: str,
        report: StageReport,
    ) -> DataFrame:
        stream = self.stream_rows(stage, rows).withColumn(ROW_ID, F.monotonically_increasing_id())
        master_rows = self._master_frame(stage, master)
        require_disjoint(stream, master_rows, stage.name)
        joined, layout = self.theta_layout(stage).join_flagged(
            stream, master, master_rows, ROW_ID, run_id
        )
        report.extra.update(layout.as_metrics())
        return joined

    def _count(self, joined: DataFrame, report: StageReport) -> None:
        row = joined.agg(
            F.count_distinct(ROW_ID).alias("tuples"),
            F.count_distinct(F.when(F.col(MATCHED), F.col(ROW_ID))).alias("matched"),
            F.sum(F.col(MATCHED).cast("int")).alias("match_rows"),
        ).first()
        assert row is not None
        report.tuples_in = int(row["tuples"])
        report.tuples_matched = int(row["matched"])
        report.tuples_unmatched = report.tuples_in - report.tuples_matched
        stage = self.config.stage(report.stage)
        report.output_rows = int(row["match_rows"] or 0) + (
            report.tuples_unmatched if stage.join == "left" else 0
        )

    def _write_output(
        self,
        stage: EquiStage | ThetaStage,
        output: DataFrame,
        txn: AppTransaction,
        report: StageReport,
    ) -> None:
        path = self.layout.output(stage.output)
        self.engine.create_table(path, output.schema, (INTERVAL_START,))
        outcome = self.engine.append(path, output, txn)
        report.committed = outcome.committed
        if outcome.committed:
            report.extra["output_version"] = outcome.table_version

    def drain(self, run_id: str) -> list[StageReport]:
        """Bring every stage up to date with its input; nothing stays pending afterwards.

        Baseline stages hold no pending state; SSBJ stages keep stepping until H_S is empty.
        Stages run in config order, so a chained stage sees its input fully drained.
        """
        reports = []
        for stage in self.config.stages:
            self._progress(f"drain {stage.name}")
            if isinstance(stage, EquiStage) and stage.operator.mode != "baseline":
                reports.append(self._run_ssbj(stage, run_id, drain=True))
            else:
                reports.append(self.run_stage_step(stage, run_id))
        return reports

    # ------------------------------------------------------------------ backfill

    def backfill(self, start: datetime, end: datetime, run_id: str) -> list[StageReport]:
        """Re-join the interval's rows against the masters as of ``end``; replace the output.

        Each stage reads its input's rows of the interval (for a chained stage, the
        replaced output of the previous stage) and replaces the output partitions whose
        ``_interval_start`` lies in [start, end), atomically, in one commit.
        """
        reports = []
        where = [
            PartitionFilter(INTERVAL_START, ">=", start),
            PartitionFilter(INTERVAL_START, "<", end),
        ]
        for stage in self.config.stages:
            self._progress(f"backfill {stage.name} [{start.isoformat()}, {end.isoformat()})")
            started = time.monotonic()
            input_path = self.layout.input_table(self.config, stage.input)
            master = self._master_as_of(self.layout.master(self.config, stage.master), end)
            input_snapshot = self.engine.snapshot(input_path)
            input_version = input_snapshot.version
            rows = self.stream_rows(stage, self.engine.read_files(input_snapshot)).where(
                (F.col(INTERVAL_START) >= F.lit(start)) & (F.col(INTERVAL_START) < F.lit(end))
            )
            joined = self._join(stage, rows, master).cache()
            try:
                report = StageReport(stage.name, master_version=master.version)
                self._count(joined, report)
                output = baseline.finish(joined, stage.join)
                path = self.layout.output(stage.output)
                self.engine.create_table(path, output.schema, (INTERVAL_START,))
                with operation(self.engine, BACKFILL):
                    outcome = self.engine.replace(path, output, where)
                report.committed = outcome.committed
            finally:
                joined.unpersist()
            report.seconds = time.monotonic() - started
            self.store.record_metrics(run_id, f"backfill.{stage.name}", 0, report.as_metrics())
            if isinstance(stage, EquiStage) and stage.operator.mode != "baseline":
                self.ssbj_stage(stage).record_backfill(start, end, input_version)
            reports.append(report)
        return reports

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
