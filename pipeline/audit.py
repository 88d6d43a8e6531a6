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
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import BackfillIncompleteError, ConfigError, ValidationFailedError
from common.faults import crash_point
from common.phase_clock import optional_phase
from joins.columns import INTERVAL_START
from pipeline.config import PipelineConfig
from pipeline.drivers import StageDrivers
from pipeline.layout import WarehouseLayout
from pipeline.pins import audit_holder, audit_pins
from quality.audit_views import (
    INPUT_VIEW,
    PENDING_VIEW,
    PUBLISHED_VIEW,
    no_pending,
    no_pending_arrow,
    no_published,
    no_published_arrow,
    oldest_interval_arrow,
    published_tuples,
    published_tuples_arrow,
)
from quality.batch_engine import BatchEngine, InMemoryBatch, choose_batch_engine, queries_views
from quality.config import QualityConfig
from quality.docs_queue import DocsQueue
from quality.results import RESULTS_SCHEMA, SuiteOutcome, result_rows
from warehouse.delta import AppTransaction, DataFile, DeltaEngine, PartitionFilter, Snapshot
from warehouse.delta.api import (
    COMMIT_VERSION,
    append_live_rows_added,
    count_live_rows_added,
    live_rows_added,
    live_rows_added_arrow,
)
from warehouse.state_store import StateStore

if TYPE_CHECKING:
    from great_expectations.core.expectation_suite import ExpectationSuite

logger = logging.getLogger(__name__)

RUN_ID, FAILED_EXPECTATIONS, QUARANTINED_AT = "_run_id", "_failed_expectations", "_quarantined_at"
BATCH_TO = "_batch_to"  # a quarantined row's batch: the silver version it was staged up to
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
    """How to build a batch's audit views, for the engine that validates it: as Spark
    frames (``spark``), or in the driver's memory (``arrow``, None where only the Spark
    frames exist: their rows are then collected). Built only when a suite reads them."""

    spark: Callable[[], dict[str, DataFrame]]
    arrow: Callable[[], dict[str, pa.Table]] | None = None


class StagedBatch:
    """The batch under audit as a Spark frame, planned only when something reads its rows.

    A live batch validated in memory is read in the driver and published by adding its
    files to gold, so its Spark frame (a read of each version's files: planning alone cost
    0.1-0.2 s a table) is built only for Spark validation, a count the log cannot give, a
    quarantine or a backfill's replace. The checks on Spark types need only its schema:
    :meth:`schema_frame` is an empty frame of the table's schema, which every file of a
    Delta table version has."""

    def __init__(self, spark: SparkSession, read: Callable[[], DataFrame], schema: T.StructType):
        self._spark = spark
        self._read = read
        self._schema = schema
        self._frame: DataFrame | None = None
        self._cached = False

    def frame(self) -> DataFrame:
        """The batch's rows (read once)."""
        if self._frame is None:
            self._frame = self._read()
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


class AuditPublisher:
    """Audits staged output batches and publishes or quarantines them."""

    def __init__(
        self,
        config: PipelineConfig,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        gate: Any = None,
        drivers: StageDrivers | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.store = store
        self.spark = spark
        self.layout = WarehouseLayout.of(config)
        self.drivers = drivers or StageDrivers(config, spark, engine, store)
        self.inputs = self.drivers.inputs
        self._gate = gate

    @property
    def gate(self) -> Any:
        if self._gate is None:
            from quality.gate import QualityGate  # GX loads only when a suite runs

            assets = self.config.docs_assets_dir
            self._gate = QualityGate.of(self.layout.gx_project(), Path(assets) if assets else None)
        return self._gate

    def _update_docs(self) -> None:
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
            self._update_docs()  # whatever was validated before an error is shown too
        self._raise_for(run_id, audits)
        return audits

    def _audit_live_batch(self, table: str, run_id: str, failures: list[str]) -> TableAudit:
        silver = self.layout.staged(table)
        stage = self.config.producing_stage(table)
        state = self._state(table)
        self._require_no_backfill_running(table, state)
        finished = self._finish_intent(table, state)
        audited = int(state["output_version"])
        if not self.engine.exists(silver):
            return TableAudit(table, run_id, (audited, audited), NOTHING_NEW)
        latest = self.engine.snapshot(silver).version
        last = state.get("last") or {}
        if latest == audited and last.get("run_id") == run_id:
            # A retry of a run whose audit completed: report the same outcome again.
            if finished is not None:
                return finished
            return TableAudit(
                table, run_id, tuple(last["batch"]), last["action"], failures=last["failures"]
            )
        if latest == audited and not failures:
            return TableAudit(table, run_id, (audited, latest), NOTHING_NEW)
        driver = self.drivers.driver(stage)
        consumed = driver.consumed_version()
        staged = self._live_batch(silver, audited, latest)
        # Tuples that were still pending at the last audit are accounted for now: emitted
        # in this batch, published by an earlier one, or still pending.
        pending_before = state.get("pending_version")
        recorded_table = state.get("pending_table")
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
        input_from = int(state["input_version"])

        def spark_views() -> dict[str, DataFrame]:
            input_rows = self.inputs.new_rows(stage, input_from, consumed)
            waiting = driver.pending_at(int(pending_before)) if pending_before is not None else None
            pending = driver.pending_ages(id_column)
            return {
                INPUT_VIEW: driver.input_accounting(input_rows, waiting, id_column),
                PENDING_VIEW: (
                    pending
                    if pending is not None
                    else no_pending(self.spark, self._id_type(table, input_rows))
                ),
                PUBLISHED_VIEW: self._published_view(table, input_rows, waiting),
            }

        def arrow_views() -> dict[str, pa.Table]:
            tuples = self.inputs.new_rows_arrow(stage, input_from, consumed)
            waiting = (
                driver.pending_at_arrow(int(pending_before)) if pending_before is not None else None
            )
            pending = driver.pending_ages_arrow(id_column)
            id_type = tuples.schema.field(id_column).type
            return {
                INPUT_VIEW: driver.input_accounting_arrow(tuples, waiting, id_column),
                PENDING_VIEW: pending if pending is not None else no_pending_arrow(id_type),
                PUBLISHED_VIEW: self._published_view_arrow(table, tuples, waiting),
            }

        pending_now = driver.pending_version()
        return self._decide_and_commit(
            table,
            run_id,
            staged,
            (audited, latest),
            AuditViews(spark_views, arrow_views if self.engine.arrow_in_driver else None),
            failures,
            state,
            record={
                "input_version": consumed,
                "pending_version": pending_now,
                "pending_table": driver.pending_table(),
            },
            rows=count_live_rows_added(self.engine, silver, audited, latest),
        )

    def _live_batch(self, silver: str, audited: int, latest: int) -> StagedBatch:
        """Rows of files added in (audited, latest] still live at latest, minus backfills'."""
        return StagedBatch(
            self.spark,
            lambda: live_rows_added(self.engine, silver, audited, latest).drop(COMMIT_VERSION),
            self.engine.snapshot(silver, latest).schema,
        )

    def _interval_batch(
        self, silver: str, version: int, interval: tuple[datetime, datetime]
    ) -> StagedBatch:
        """Rows of ``silver`` at ``version`` whose interval starts in ``interval``."""
        start, end = interval
        return StagedBatch(
            self.spark,
            lambda: self.engine.read(silver, version=version).where(
                (F.col(INTERVAL_START) >= F.lit(start)) & (F.col(INTERVAL_START) < F.lit(end))
            ),
            self.engine.snapshot(silver, version).schema,
        )

    # ------------------------------------------------------------------ backfills

    def begin_backfill(self, run_id: str, start: datetime, end: datetime) -> None:
        """Record that a backfill of [start, end) is running, before it writes anything.

        Until :meth:`audit_backfill` completes, live audits of the outputs refuse to
        publish: the interval in ``silver`` may already be replaced while ``gold`` is not.
        An open live intent is finished first, so the backfill starts from a clean state.
        """
        for table in self.config.outputs():
            state = self._state(table)
            self._finish_intent(table, state)
            state["backfill_running"] = {
                "run_id": run_id,
                "start": start.isoformat(),
                "end": end.isoformat(),
            }
            self._save_state(table, state)

    def audit_backfill(self, run_id: str, start: datetime, end: datetime) -> list[TableAudit]:
        """Audit the replaced interval of every output and replace it in the published table."""
        audits: list[TableAudit] = []
        try:
            self._audit_backfill_tables(run_id, start, end, audits)
        finally:
            self._update_docs()  # whatever was validated before an error is shown too
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
            state = self._state(table)
            self._finish_intent(table, state)
            if not self.engine.exists(silver):
                state.pop("backfill_running", None)
                self._save_state(table, state)
                continue
            # The backfill holds the pipeline lease, so the latest silver version is the
            # commit its replace of this table made.
            latest = self.engine.snapshot(silver).version
            staged = self._interval_batch(silver, latest, (start, end))
            input_table = self.layout.input_table(self.config, stage.input)
            input_rows = self.inputs.with_interval(stage, self.engine.read(input_table)).where(
                in_interval
            )
            id_type = self._id_type(table, input_rows)
            accounting = self.drivers.driver(stage).input_accounting(
                input_rows, None, self._id_column(table)
            )
            views = AuditViews(
                functools.partial(
                    dict,
                    {
                        INPUT_VIEW: accounting,
                        PENDING_VIEW: no_pending(self.spark, id_type),
                        PUBLISHED_VIEW: no_published(self.spark, id_type),
                    },
                )
            )
            failures = []
            if stage.input in quarantined:
                failures.append(f"upstream table {stage.input} was quarantined in this run")
            audit = self._decide_and_commit(
                table,
                run_id,
                staged,
                (int(state["output_version"]), latest),
                views,
                failures,
                state,
                record={},
                interval=(start, end),
            )
            if audit.action == QUARANTINED:
                quarantined.add(table)
            audits.append(audit)

    def _require_no_backfill_running(self, table: str, state: dict[str, Any]) -> None:
        running = state.get("backfill_running")
        if running:
            raise BackfillIncompleteError(
                f"{table}: backfill {running['run_id']} of [{running['start']}, "
                f"{running['end']}) started but did not finish, so the interval may be "
                "replaced in silver but not yet in gold; nothing is published until it "
                f"completes. Rerun `enrich backfill --start {running['start']} --end "
                f"{running['end']}`."
            )

    # ------------------------------------------------------------------ intents

    def _decide_and_commit(
        self,
        table: str,
        run_id: str,
        staged: StagedBatch,
        batch: tuple[int, int],
        views: AuditViews,
        failures: list[str],
        state: dict[str, Any],
        record: dict[str, Any],
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
        suites = self._suites(table, quality)
        expectations = [
            (e.expectation_type, e.configuration.kwargs) for s in suites for e in s.expectations
        ]
        engine = choose_batch_engine(
            expectations, rows, quality.in_memory_max_rows if quality is not None else 0
        )
        if suites:
            logger.info("audit %s: validated with GX on %s (%s)", table, engine.name, engine.reason)
        # Views are built only when a suite reads them: cached on Spark, or in the driver's
        # memory for an in-memory batch (the Spark frames collected where that cannot be).
        frames: dict[str, DataFrame] = {}
        collected: dict[str, pa.Table] | None = None
        if queries_views(expectations):
            if engine.name == "spark":
                staged.cache()
                frames = {name: view.cache() for name, view in views.spark().items()}
            else:
                if views.arrow is not None:
                    with optional_phase(self.engine.clock, "validate"):
                        collected = self._arrow_views(table, views.arrow)
                if collected is None:
                    frames = views.spark()
        try:
            audit = self._decide(
                table,
                run_id,
                staged,
                batch,
                frames,
                collected,
                failures,
                rows,
                suites,
                engine,
                interval,
            )
            state["intent"] = {
                "run_id": run_id,
                "batch": list(batch),
                "action": audit.action,
                "rows": audit.rows,
                "failures": audit.failures,
                "interval": [t.isoformat() for t in interval] if interval else None,
                "record": record,
                "expectations_evaluated": sum(len(o.expectations) for o in audit.outcomes),
                "expectations_failed": sum(len(o.failures) for o in audit.outcomes),
            }
            self._save_state(table, state)
            crash_point("audit.before_publish")
            self._commit_decision(table, audit, staged, interval)
            crash_point("audit.after_publish")
        finally:
            staged.unpersist()
            for view in frames.values():
                view.unpersist()
        self._record(table, state)
        return audit

    def _finish_intent(self, table: str, state: dict[str, Any]) -> TableAudit | None:
        """Complete an audit whose decision was recorded but whose state was not."""
        intent = state.get("intent")
        if not intent:
            return None
        batch = (int(intent["batch"][0]), int(intent["batch"][1]))
        interval: tuple[datetime, datetime] | None = None
        silver = self.layout.staged(table)
        if intent.get("interval"):
            interval = (
                datetime.fromisoformat(intent["interval"][0]),
                datetime.fromisoformat(intent["interval"][1]),
            )
            staged = self._interval_batch(silver, batch[1], interval)
        else:
            staged = self._live_batch(silver, *batch)
        audit = TableAudit(
            table, intent["run_id"], batch, intent["action"], intent["rows"], intent["failures"]
        )
        logger.warning(
            "audit %s: finishing the interrupted audit of run %s, batch v%d..v%d (%s)",
            table,
            audit.run_id,
            batch[0] + 1,
            batch[1],
            audit.action,
        )
        self._commit_decision(table, audit, staged, interval)
        self._record(table, state)
        return audit

    def _commit_decision(
        self,
        table: str,
        audit: TableAudit,
        staged: StagedBatch,
        interval: tuple[datetime, datetime] | None,
    ) -> None:
        txn = AppTransaction(f"publish.{table}", audit.batch[1])
        if audit.action == QUARANTINED:
            self._quarantine(audit, staged.frame())
        elif interval is not None:
            path = self.layout.published(table)
            where = [
                PartitionFilter(INTERVAL_START, ">=", interval[0]),
                PartitionFilter(INTERVAL_START, "<", interval[1]),
            ]
            rows = staged.frame()
            self.engine.create_table(path, rows.schema, (INTERVAL_START,))
            self.engine.replace(path, rows, where, txn)
        elif audit.rows:
            # The live batch is whole files of silver: they are added to gold as they are.
            append_live_rows_added(
                self.engine,
                self.layout.staged(table),
                *audit.batch,
                self.layout.published(table),
                txn,
                partition_by=(INTERVAL_START,),
            )

    def _record(self, table: str, state: dict[str, Any]) -> None:
        """Turn the intent into the audit state, in one state-store transaction."""
        intent = state.pop("intent")
        record = intent["record"]
        batch = intent["batch"]
        if intent.get("interval"):
            state.pop("backfill_running", None)
        else:
            state.update(
                output_version=int(batch[1]),
                input_version=int(record["input_version"]),
                pending_version=record["pending_version"],
                pending_table=record.get("pending_table"),
            )
        state["last"] = {
            "run_id": intent["run_id"],
            "batch": list(batch),
            "action": intent["action"],
            "failures": intent["failures"],
        }
        if intent["action"] == QUARANTINED:
            state["quarantined"].append(
                {
                    "run_id": intent["run_id"],
                    "batch": list(batch),
                    "failures": intent["failures"],
                    "resolved": False,
                }
            )
        self._save_state(table, state)
        quarantined = intent["action"] == QUARANTINED
        self.store.record_metrics(
            intent["run_id"],
            f"quality.{table}",
            int(batch[1]),
            {
                "rows_published": 0 if quarantined else intent["rows"],
                "rows_quarantined": intent["rows"] if quarantined else 0,
                "expectations_evaluated": intent["expectations_evaluated"],
                "expectations_failed": intent["expectations_failed"],
                "batch_failed": float(bool(intent["failures"])),
            },
        )

    # ------------------------------------------------------------------ resolution

    def unresolved(self) -> list[dict[str, Any]]:
        """Quarantined batches nobody has resolved yet, oldest first."""
        return [
            {"table": table, **entry}
            for table in self.config.outputs()
            for entry in self._state(table)["quarantined"]
            if not entry.get("resolved")
        ]

    def resolve(self, table: str, run_id: str, publish: bool) -> int:
        """Mark a quarantined batch resolved; with ``publish``, publish its rows as they are.

        Returns the number of rows published. Idempotent: the publish commit carries an app
        transaction of its own per batch.
        """
        state = self._state(table)
        entries = [e for e in state["quarantined"] if e["run_id"] == run_id]
        if not entries:
            known = [e["run_id"] for e in state["quarantined"]]
            raise ConfigError(
                f"resolve: no quarantined batch of {table!r} from run {run_id!r}; "
                f"quarantined runs: {known}"
            )
        published = 0
        for entry in entries:
            if publish and not entry.get("resolved"):
                batch_to = int(entry["batch"][1])
                rows = (
                    self.engine.read(self.layout.quarantined_output(table))
                    .where((F.col(RUN_ID) == run_id) & (F.col(BATCH_TO) == batch_to))
                    .drop(RUN_ID, FAILED_EXPECTATIONS, QUARANTINED_AT, BATCH_TO)
                )
                outcome = self._publish(
                    table, rows, AppTransaction(f"release.{table}.{batch_to}", 1)
                )
                published += outcome
            entry["resolved"] = True
            entry["resolution"] = "published" if publish else "acknowledged"
        self._save_state(table, state)
        logger.info("resolved quarantined batch(es) of %s from run %s", table, run_id)
        return published

    def unresolved_rows_arrow(self, table: str) -> pa.Table | None:
        """The root stream's id and ``_interval_start`` of the rows in ``table``'s
        quarantined batches nobody resolved yet (answered, not published), read in the
        driver's memory; None when there are none."""
        batches = [
            int(entry["batch"][1])
            for entry in self._state(table)["quarantined"]
            if not entry.get("resolved")
        ]
        path = self.layout.quarantined_output(table)
        if not batches or not self.engine.exists(path):
            return None
        id_column = self._id_column(table)
        rows = self.engine.read_arrow(
            self.engine.snapshot(path),
            columns=[id_column, INTERVAL_START, BATCH_TO],
            where=pc.field(BATCH_TO).isin(batches),
        )
        return rows.select([id_column, INTERVAL_START])

    # ------------------------------------------------------------------ internals

    def _arrow_views(
        self, table: str, build: Callable[[], dict[str, pa.Table]]
    ) -> dict[str, pa.Table] | None:
        """The audit views built in the driver, or None when that failed (memory, say):
        the Spark views are then built and collected instead."""
        try:
            return build()
        except (pa.ArrowException, duckdb.Error, MemoryError) as e:
            logger.warning(
                "audit %s: building the audit views in memory failed (%s); Spark builds them",
                table,
                str(e).splitlines()[0][:300],
            )
            return None

    def _decide(
        self,
        table: str,
        run_id: str,
        staged: StagedBatch,
        batch: tuple[int, int],
        views: dict[str, DataFrame],
        collected: dict[str, pa.Table] | None,
        failures: list[str],
        rows: int | None,
        suites: list[ExpectationSuite],
        engine: BatchEngine,
        interval: tuple[datetime, datetime] | None,
    ) -> TableAudit:
        """Run the suites over the staged batch on ``engine`` and write their results;
        ``rows`` is the batch's row count if the log gave it; ``views`` the audit views as
        Spark frames, or ``collected`` already in the driver's memory."""
        if rows is None:
            rows = staged.frame().count()
        quality = self.config.quality.get(table)
        in_memory = None
        if engine.name == "pandas":
            in_memory = self._collect(table, staged, batch, views, collected, interval)
        outcomes = self._run_suites(table, run_id, staged, views, suites, in_memory)
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

    def _suites(self, table: str, quality: QualityConfig | None) -> list[ExpectationSuite]:
        """The suites that check ``table``: those it names, or else its config checks."""
        if quality is None or not quality.checked:
            return []
        from quality.suites import config_suite, load_suite

        directory = Path(self.config.expectations_dir)
        with optional_phase(self.engine.clock, "validate"):  # GX's import included
            return [load_suite(directory, name, quality) for name in quality.suites] or [
                config_suite(table, quality)
            ]

    def _collect(
        self,
        table: str,
        staged: StagedBatch,
        batch: tuple[int, int],
        views: dict[str, DataFrame],
        collected: dict[str, pa.Table] | None,
        interval: tuple[datetime, datetime] | None,
    ) -> InMemoryBatch:
        """The batch in the driver, and the audit views its suites query: ``collected``
        when they were built in memory, else ``views`` collected (either holds only the
        views a suite reads: :meth:`_decide_and_commit`)."""
        with optional_phase(self.engine.clock, "validate"):
            # A live batch is whole files of silver: read them in the driver, no Spark job.
            rows = (
                staged.frame().toPandas()
                if interval is not None
                else live_rows_added_arrow(
                    self.engine, self.layout.staged(table), *batch
                ).to_pandas()
            )
            if collected is None:
                collected = {name: view.toArrow() for name, view in views.items()}
        return InMemoryBatch(rows, staged.schema_frame(), collected)

    def _run_suites(
        self,
        table: str,
        run_id: str,
        staged: StagedBatch,
        views: dict[str, DataFrame],
        suites: list[ExpectationSuite],
        in_memory: InMemoryBatch | None,
    ) -> list[SuiteOutcome]:
        """Validate the batch against ``suites``: ``in_memory`` (GX's pandas engine, DuckDB
        for SQL) when the batch was collected, else ``staged`` on Spark."""
        if not suites:
            return []
        with optional_phase(self.engine.clock, "validate"):
            batch = staged.frame() if in_memory is None else in_memory
            return [
                self.gate.validate(table, suite, batch, run_id, views=views) for suite in suites
            ]

    def _publish(self, table: str, rows: DataFrame, txn: AppTransaction) -> int:
        path = self.layout.published(table)
        outcome = self.engine.append(path, rows, txn, partition_by=(INTERVAL_START,))
        return outcome.rows_added

    def _quarantine(self, audit: TableAudit, staged: DataFrame) -> None:
        rows = (
            staged.withColumn(RUN_ID, F.lit(audit.run_id))
            .withColumn(BATCH_TO, F.lit(audit.batch[1]).cast(T.LongType()))
            .withColumn(
                FAILED_EXPECTATIONS,
                F.array(*[F.lit(f) for f in audit.failures]).cast(
                    T.ArrayType(T.StringType(), True)
                ),
            )
            .withColumn(QUARANTINED_AT, F.current_timestamp())
        )
        path = self.layout.quarantined_output(audit.table)
        self.engine.append(
            path,
            rows,
            AppTransaction(f"quarantine.{audit.table}", audit.batch[1]),
            partition_by=(),
        )

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

    def _save_state(self, table: str, state: dict[str, Any]) -> None:
        """Save the audit state with the pins of the versions it (and an open intent) reads,
        in one transaction: never a saved state whose versions a vacuum could delete."""
        pins = audit_pins(self.layout, table, state)
        self.store.save_operator_state(f"audit.{table}", state, pins=(audit_holder(table), pins))

    def _state(self, table: str) -> dict[str, Any]:
        return self.store.operator_state(f"audit.{table}") or {
            "output_version": 0,
            "input_version": 0,
            "quarantined": [],
            "last": None,
        }

    def _published_view(
        self, table: str, input_rows: DataFrame, waiting: DataFrame | None
    ) -> DataFrame:
        """Ids of the tuples this audit accounts for that have rows in an earlier batch,
        published or quarantined.

        Those are the tuples that were waiting at the last audit (a left-join tuple matched
        earlier has nothing left to emit at expiry; its rows may sit in a quarantined batch
        until someone resolves it) and the new tuples of an interval a backfill has already
        published. Only the files of those tables that may hold rows of the tuples' oldest
        interval or later are read (partition values and log statistics): a live audit
        reads none of gold's past intervals, whatever gold's size.
        """
        id_type = self._id_type(table, input_rows)
        earlier = self._earlier_tables(table)
        if not earlier:
            return no_published(self.spark, id_type)
        id_column = self._id_column(table)
        tuples = input_rows.select(id_column, INTERVAL_START)
        if waiting is not None:
            tuples = tuples.unionByName(waiting.select(id_column, INTERVAL_START))
        first = tuples.agg(F.min(INTERVAL_START).alias("oldest")).first()  # one small job
        oldest = None if first is None else first["oldest"]
        if oldest is None:
            return no_published(self.spark, id_type)
        found = [
            published_tuples(self.engine.read_files(snapshot, files), tuples, id_column)
            for snapshot, files in self._files_since(earlier, oldest)
        ]
        if not found:
            return no_published(self.spark, id_type)
        return found[0] if len(found) == 1 else found[0].unionByName(found[1]).distinct()

    def _published_view_arrow(
        self, table: str, tuples: pa.Table, waiting: pa.Table | None
    ) -> pa.Table:
        """:meth:`_published_view` in the driver's memory: the same files, read with only
        the id and interval columns."""
        id_column = self._id_column(table)
        id_type = tuples.schema.field(id_column).type
        asked = tuples.select([id_column, INTERVAL_START])
        if waiting is not None:
            asked = pa.concat_tables(
                [asked, waiting.select([id_column, INTERVAL_START]).cast(asked.schema)]
            )
        oldest = oldest_interval_arrow([asked])
        if oldest is None:
            return no_published_arrow(id_type)
        found = []
        for snapshot, files in self._files_since(self._earlier_tables(table), oldest):
            columns = [c for c in (id_column, INTERVAL_START) if c in snapshot.schema.names]
            rows = self.engine.read_arrow(snapshot, files, columns)
            found.append(published_tuples_arrow(rows, asked, id_column, oldest))
        if not found:
            return no_published_arrow(id_type)
        ids = pa.concat_tables(found)
        return ids if len(found) == 1 else ids.group_by([ids.column_names[0]]).aggregate([])

    def _earlier_tables(self, table: str) -> list[str]:
        """The tables holding ``table``'s earlier batches (published, quarantined) that exist."""
        return [
            path
            for path in (self.layout.published(table), self.layout.quarantined_output(table))
            if self.engine.exists(path)
        ]

    def _files_since(
        self, paths: list[str], oldest: datetime
    ) -> list[tuple[Snapshot, list[DataFile]]]:
        """Each table's latest snapshot and its files that may hold rows of ``oldest``'s
        interval or later (partition values and log statistics), for the tables with any."""
        found = []
        for path in paths:
            snapshot = self.engine.snapshot(path)
            files = [f for f in snapshot.files if f.may_hold_since(INTERVAL_START, oldest)]
            if files:
                found.append((snapshot, files))
        return found

    def _id_column(self, table: str) -> str:
        return self.config.streams[self.config.root_stream(table)].id_column

    def _id_type(self, table: str, input_rows: DataFrame) -> T.DataType:
        return input_rows.schema[self._id_column(table)].dataType

    @staticmethod
    def _raise_for(run_id: str, audits: list[TableAudit]) -> None:
        failed = [a for a in audits if a.action == QUARANTINED]
        if failed:
            raise ValidationFailedError(
                f"run {run_id}: {len(failed)} output batch(es) failed their quality suites "
                "and were quarantined, not published: "
                + " | ".join(f"{a.table} ({a.rows} rows): {'; '.join(a.failures)}" for a in failed)
            )
