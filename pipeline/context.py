"""The assembled pipeline: config, Spark session, Delta engine, state store, runner.

``open_pipeline`` builds them in that order and ``PipelineContext.execute`` runs one CLI
command inside the run ledger, so every command leaves a ``runs`` row that says whether it
succeeded and, if not, why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from pyspark.sql import SparkSession

from common.errors import EXIT_OK, EXIT_PARTIAL, ConfigError, EnrichmentError
from common.phase_clock import SECONDS_PREFIX, TASK_PREFIX, TOTAL, PhaseClock
from pipeline.audit import AuditPublisher
from pipeline.backfill import backfill
from pipeline.config import PipelineConfig
from pipeline.handles import PipelineHandles
from pipeline.layout import WarehouseLayout
from pipeline.runner import PipelineRunner
from warehouse.delta import DeltaEngine, open_engine
from warehouse.lease import LeaseSettings, PipelineLease
from warehouse.object_store import ObjectStore
from warehouse.spark import (
    SparkSettings,
    build_session,
    effective_master,
    effective_remote,
    is_connect,
)
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)

SESSION_PHASE = "session_start"


@dataclass
class PipelineContext:
    config: PipelineConfig
    spark: SparkSession
    engine: DeltaEngine
    store: StateStore
    runner: PipelineRunner
    session_seconds: float = 0.0
    """How long building (or joining) the Spark session took, charged to the first task."""

    @property
    def layout(self) -> WarehouseLayout:
        return self.runner.layout

    @cached_property
    def auditor(self) -> AuditPublisher:
        return AuditPublisher(self.runner.handles, drivers=self.runner.drivers)

    @contextmanager
    def exclusive(self, purpose: str, wait_seconds: float = 0.0) -> Iterator[PipelineLease]:
        """Hold the pipeline lease; every state-store write and Delta commit is fenced by it."""
        settings = LeaseSettings(
            ttl_seconds=self.config.warehouse.lease_ttl_seconds, wait_seconds=wait_seconds
        )
        with PipelineLease(self.store, self.config.name, purpose, settings) as lease:
            self.engine.commit_guard = lease.check
            self.engine.commit_metadata = {"enrichment.run": purpose}
            try:
                yield lease
            finally:
                self.engine.commit_guard = None
                self.engine.commit_metadata = {}

    def execute(
        self,
        command: str,
        run_id: str,
        start: datetime | None = None,
        end: datetime | None = None,
        stage: str | None = None,
        echo: Callable[[str], None] | None = None,
        steps: int | None = None,
        drain: bool = False,
    ) -> int:
        """Run one command as a ledger run; return the CLI exit code.

        ``echo`` receives the lines a command reports to its caller (``maintain``: one per
        table); ``steps`` and ``drain`` are ``stage``'s options.
        """
        kind = {"backfill": "backfill", "drain": "drain", "stream": "stream"}.get(
            command, "scheduled"
        )
        # One ledger row per task of a run; metrics stay keyed by the run id itself.
        task = f"{command}" + (f".{stage}" if stage else "")
        ledger_id = f"{run_id}/{task}"
        self.store.start_run(ledger_id, kind, start, end)
        clock = PhaseClock()
        clock.add(SESSION_PHASE, self.session_seconds)
        self.session_seconds = 0.0  # a second command in this process joined a warm session
        self.engine.clock = clock
        try:
            code = self._execute(command, run_id, start, end, stage, echo, steps, drain)
        except EnrichmentError as e:
            self.store.finish_run(ledger_id, error=f"{type(e).__name__}: {e}")
            raise
        except Exception as e:
            self.store.finish_run(ledger_id, error=f"unexpected {type(e).__name__}: {e}")
            raise
        finally:
            self.engine.clock = None
            try:
                self._record_timings(run_id, task, clock)
            except Exception as e:  # noqa: BLE001 - timings never decide a task's outcome
                logger.warning("could not record the timings of task %s: %s", task, e)
        self.store.finish_run(ledger_id, error=None if code == EXIT_OK else f"exit code {code}")
        return code

    def _record_timings(self, run_id: str, task: str, clock: PhaseClock) -> None:
        """Seconds per phase of this task, as ``task.<task>`` metrics of the run."""
        phases = clock.seconds()
        total = sum(phases.values())  # the same instant as the phases
        logger.info(
            "task %s of run %s took %.1fs: %s",
            task,
            run_id,
            total,
            ", ".join(f"{name} {value:.1f}s" for name, value in sorted(phases.items())),
        )
        seconds = {f"{SECONDS_PREFIX}{name}": value for name, value in phases.items()}
        seconds[f"{SECONDS_PREFIX}{TOTAL}"] = total
        self.store.record_metrics(run_id, f"{TASK_PREFIX}{task}", 0, seconds)

    def _execute(
        self,
        command: str,
        run_id: str,
        start: datetime | None,
        end: datetime | None,
        stage: str | None,
        echo: Callable[[str], None] | None = None,
        steps: int | None = None,
        drain: bool = False,
    ) -> int:
        code = EXIT_OK
        if command in ("ingest", "run", "stream"):
            reports = self.runner.ingest(run_id)
            if any(r.errors for r in reports):
                code = EXIT_PARTIAL
        if command == "stream":
            # A micro-batch of the continuous mode (pipeline.stream_service): one step of
            # every stage, without closing a run, then what was staged is published.
            self.runner.run_stages(run_id, steps=1, close=False)
            self._validate(run_id, start, end)
        if command == "stage":
            if stage is None:
                raise ConfigError("stage: a stage name is required")
            self.runner.run_stage_step(self.config.stage(stage), run_id, steps, drain)
        if command == "run":
            self.runner.run_stages(run_id)
        if command == "drain":
            self.runner.drain(run_id)
        if command == "backfill":
            if start is None or end is None:
                raise ConfigError("backfill: --start and --end are required")
            backfill(self.runner, self.auditor, start, end, run_id)
            # The replaced intervals' completeness, as a validate records it: a backfill
            # answers and publishes every tuple of its window that the live chain holds
            # no longer.
            self._record_completeness(run_id, start, end)
        if command == "validate":
            self._validate(run_id, start, end)
        if command == "maintain":
            from pipeline.maintenance import maintain

            maintain(self.config, self.engine, self.store, echo)
        return code

    def _validate(self, run_id: str, start: datetime | None, end: datetime | None) -> None:
        """Audit and publish every output's staged batch, then record each interval's
        completeness."""
        from pipeline.conservation import check_run

        extra: dict[str, list[str]] = {}
        for problem in check_run(self.config, self.engine, self.store, run_id):
            table = self.config.stage(problem.stage).output
            extra.setdefault(table, []).append(
                f"step counters of {problem.stage} step {problem.step}: {problem.message}"
            )
        self.auditor.audit_run(run_id, extra)
        self._record_completeness(run_id, start, end)

    def _record_completeness(
        self, run_id: str, start: datetime | None, end: datetime | None
    ) -> None:
        """Per output and interval: what is published, what still waits (status, the run
        report and the Airflow Asset events read it)."""
        from pipeline.completeness import record_completeness

        record_completeness(
            self.runner.drivers, run_id, (start, end), self.auditor.unresolved_rows_arrow
        )


@contextmanager
def open_pipeline(
    config: PipelineConfig, spark: SparkSession | None = None, master: str | None = None
) -> Iterator[PipelineContext]:
    """Assemble the pipeline; the Spark session is reused if one is active.

    ``master`` is the command line's ``--master`` (see :func:`warehouse.spark.effective_master`).
    """
    settings = SparkSettings(
        app_name=f"enrich-{config.name}",
        master=effective_master(master, config.spark.master),
        conf=config.spark.conf,
        remote=effective_remote(config.spark.remote),
        # Only delta-spark needs its jars; leaving them off saves every session start ~2 s.
        delta_jars=config.warehouse.engine == "native",
        object_store=ObjectStore.from_environment() if config.uses_object_store() else None,
    )
    started = time.perf_counter()
    session = spark or build_session(settings)
    session_seconds = time.perf_counter() - started
    engine = open_engine(session, config.warehouse.engine, config.warehouse.table_properties())
    store = StateStore(config.warehouse.resolved_state_store())
    try:
        yield PipelineContext(
            config,
            session,
            engine,
            store,
            PipelineRunner(PipelineHandles(config, session, engine, store)),
            session_seconds,
        )
    finally:
        store.dispose()
        if spark is None and is_connect(session):
            # Frees this client's session on the shared server (temp views, cached plans);
            # the server keeps running for the next task.
            session.stop()
