"""The stateful SSBJ / MESHJOIN stage driver: one Algorithm 1 loop iteration per step.

Operator state lives in Delta tables under ``_operators/<stage>/``:

``pending``  H_S: tuples waiting for the cyclic scan, partitioned by entry step (adding a
             chunk appends a partition; expiring the oldest drops one; nothing is rewritten)
``matched``  (entry step, pending id) of pending tuples that met a master row (left joins)
``stats``    per-step counters per join value: cache hits (f_count) and master rows
             (s_count), partitioned by step, dropped when no longer needed
``cache``    H_R: all projected master rows of each cached value, at the cache's version;
             a value without master rows has one ``_empty`` marker row
``switch``   the switching buffer s_B, partitioned by step
``marked``   the values chosen for switching at the start of the switching cycle
``scan``     the operator's copy of the master for the cyclic scan, partitioned by
             ``_scan_part`` = hash(row) mod k, so partition p of every version holds |R|/k
             rows however the master's writer laid out its files (see :meth:`_scan_versions`)

and small controller state (step counter, versions, chunk pins) in the state store.

Version pins (holder ``ssbj.<stage>``, see :mod:`pipeline.pins`): the master versions that
pending chunks are pinned to and that the cache and the switching buffer are at; while a
step's plan is open also the plan's master version, the master versions whose changes bring
the cache and the buffer to it, the operator-table versions and the input versions. The
pins are set before the plan is saved (a rerun after a crash reads exactly those versions)
and replaced by the completed state's pins when the step completes.

Exactly once: before anything is written, the step's plan (input range, master version,
and the version of every operator table) is saved. All reads use those pinned versions,
every write carries the app transaction ``(table, step)``, destructive writes (cache
overwrite, expiry) come last, and the step is completed in one state-store transaction. A
rerun after a crash anywhere recomputes the same results and skips the writes that landed.

Point in time: each tuple is pinned to the master version in force when it entered; the
disk phase reads partition p of that version by time travel until the tuple expires. The
cache is brought to the current version from the master's changes before it serves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cache.inequality import TupleSizes
from cache.intake import Admission, OperatorMemory, admit, chunk_capacity
from cache.rcycle import CycleState, StepPosition
from common.errors import ConfigError, JoinError, NotAppendOnlyError
from common.faults import crash_point
from joins import ssbj
from joins.columns import INTERVAL_START
from joins.mesh_partitions import partition_by_bytes
from pipeline.config import EquiStage, PipelineConfig
from pipeline.layout import WarehouseLayout
from pipeline.pins import input_versions, ssbj_holder, union_pins
from pipeline.row_bytes import measured_row_bytes
from warehouse.delta import AppTransaction, CommitOutcome, DeltaEngine, PartitionFilter, Snapshot
from warehouse.delta.embedded import CHANGE_TYPE
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)

TABLES = ("pending", "matched", "stats", "cache", "switch", "marked")
SCAN_TABLE = "scan"
ADMISSION_HORIZON_VERSIONS = 256
OWNED_TABLES = (*TABLES, SCAN_TABLE)


@dataclass
class SsbjStepReport:
    stage: str
    step: int
    tuples_in: int = 0
    cache_hits: int = 0
    cache_hits_unmatched: int = 0
    entered_pending: int = 0
    expired: int = 0
    output_rows: int = 0
    pending_rows: int = 0
    pending_bytes: int = 0
    cache_rows: int = 0
    cache_bytes: int = 0
    master_bytes_read: int = 0
    master_version: int = 0
    output_version: int | None = None
    seconds: float = 0.0
    state: str = ""
    state_bytes: float = 0.0  # Eq. 1 at the end of the step: (b + h_R)·v_R + |H_S|·v_S
    memory_bytes: int | None = None  # the budget M, when one is set
    backlog_rows: int = 0  # input rows left waiting for a later step by the budget

    def as_metrics(self) -> dict[str, float]:
        values: dict[str, float] = {
            "tuples_in": self.tuples_in,
            "cache_hits": self.cache_hits,
            "entered_pending": self.entered_pending,
            "expired": self.expired,
            "output_rows": self.output_rows,
            "pending_rows": self.pending_rows,
            "pending_bytes": self.pending_bytes,
            "cache_rows": self.cache_rows,
            "cache_bytes": self.cache_bytes,
            "master_bytes_read": self.master_bytes_read,
            "master_version": self.master_version,
            "step_seconds": self.seconds,
            "state_bytes": self.state_bytes,
            "backlog_rows": self.backlog_rows,
            # Conservation view: every tuple in is served by the cache or waits in H_S.
            "tuples_matched": self.cache_hits - self.cache_hits_unmatched,
            "tuples_unmatched": self.cache_hits_unmatched,
            "tuples_pending": self.entered_pending,
        }
        if self.output_version is not None:
            values["output_version"] = self.output_version
        if self.memory_bytes is not None:
            values["memory_bytes"] = self.memory_bytes
        return values


class SsbjStage:
    """Runs SSBJ (or MESHJOIN, with the cache off) steps for one equi stage."""

    def __init__(
        self,
        stage: EquiStage,
        config: PipelineConfig,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        input_rows: Callable[[int, int], DataFrame],
        output_path: str,
        input_path: str,
    ) -> None:
        self.stage = stage
        self.spark = spark
        self.engine = engine
        self.store = store
        self.params = stage.operator
        self.use_cache = self.params.mode == "ssbj"
        layout = WarehouseLayout.of(config)
        self.master_path = layout.master(config, stage.master)
        self.output_path = output_path
        self.input_path = input_path
        self.paths = {t: layout.operator_state(stage.name, t) for t in TABLES}
        self.scan_path = layout.operator_state(stage.name, SCAN_TABLE)
        self.spec = ssbj.JoinSpec(
            stream_keys=tuple(stage.join_on),
            master_keys=tuple(stage.join_on.values()),
            master_columns=tuple(config.masters[stage.master].columns),
            master_name=stage.master,
            how=stage.join,
        )
        # (after_version, to_version) -> new input rows with _input_version and _interval_start
        self._input_rows = input_rows

    # ------------------------------------------------------------------ public API

    def run(self, run_id: str, drain: bool = False) -> list[SsbjStepReport]:
        # Under a memory budget the backlog enters a step at a time, so every step takes
        # the input that fits; otherwise the run's first step takes all of it.
        budgeted = self.params.memory_bytes is not None
        reports = [self.step(run_id, take_input=True)]
        for _ in range(self.params.steps_per_run - 1):
            reports.append(self.step(run_id, take_input=budgeted))
        if drain:
            while self.pending_rows() > 0:
                reports.append(self.step(run_id, take_input=False))
        return reports

    def pending_rows(self) -> int:
        return self._table_rows("pending")

    def record_backfill(self, start: Any, end: Any, input_version: int) -> None:
        """Suppress later live output for tuples a backfill already joined."""
        state = self._state()
        state.setdefault("backfills", []).append(
            {"start": start.isoformat(), "end": end.isoformat(), "input_version": input_version}
        )
        self.store.save_operator_state(self.stage.name, state)

    # ------------------------------------------------------------------ state

    def _state(self) -> dict[str, Any]:
        state = self.store.operator_state(self.stage.name)
        if state is None:
            state = {
                "next_step": 0,
                "cycle_base": 0,
                "partitions": self.params.partitions,
                "cache_version": None,
                "switch_version": None,
                "hits_since": 0,
                "chunks": {},
                "backfills": [],
                "sizes": None,
                "plan": None,
            }
        return state

    def _position(self, state: dict[str, Any]) -> StepPosition:
        if state["partitions"] != self.params.partitions:
            if state["chunks"]:
                raise JoinError(
                    f"stage {self.stage.name}: operator.partitions changed from "
                    f"{state['partitions']} to {self.params.partitions} while tuples are "
                    "pending; run `enrich drain` first"
                )
            state["partitions"], state["cycle_base"] = self.params.partitions, state["next_step"]
        return StepPosition(
            state["next_step"] - state["cycle_base"],
            state["partitions"],
            self.params.eviction_cycles,
        )

    def _plan(self, state: dict[str, Any], take_input: bool) -> dict[str, Any]:
        step = state["next_step"]
        plan = state.get("plan")
        if plan is not None and plan["step"] == step:
            return dict(plan)
        offset = self.store.offset(self.stage.name)
        input_to = offset.input_version
        if take_input and self.engine.exists(self.input_path):
            input_to = self.engine.snapshot(self.input_path).version
        master = self.engine.snapshot(self.master_path)
        backlog = 0
        if self.params.memory_bytes is not None and input_to > offset.input_version:
            admission = self._admit(state, offset.input_version, input_to, master)
            input_to, backlog = admission.to_version, admission.backlog_rows
        plan = {
            "step": step,
            "input_from": offset.input_version,
            "input_to": input_to,
            "backlog_rows": backlog,
            "master_version": master.version,
            "tables": {
                t: self.engine.snapshot(p).version
                for t, p in self.paths.items()
                if self.engine.exists(p)
            },
        }
        needed = {int(v) for v in state["chunks"].values()} | {master.version}
        plan["scan"] = self._scan_versions(state, master, needed)
        state["plan"] = plan
        # Pins first: a crash before the plan is saved leaves pins the next plan replaces.
        self.store.set_pins(ssbj_holder(self.stage.name), self._pins(state, plan))
        self.store.save_operator_state(self.stage.name, state)
        return dict(plan)

    def _scan_versions(
        self, state: dict[str, Any], master: Snapshot, needed: set[int]
    ) -> dict[str, int]:
        """Scan-copy versions of the master versions ``needed``, syncing the copy to ``master``.

        The copy follows the master forward one sync per new master version, each an
        idempotent commit (app transaction ``(scan.k<k>, master version + 1)``), so the
        table itself says which master version it last copied even after a crash. An
        append-only change (every earlier file still live with its rows) appends the new
        files' rows; anything else rewrites the copy from the new snapshot. Versions the
        copy never held (state from before the copy existed) map to -1: their partitions
        are read from the master's files instead.
        """
        k = self.params.partitions
        mapping = {
            int(v): int(t)
            for v, t in state.get("scan", {}).items()
            if state.get("scan_partitions") == k
        }
        app = f"ssbj.{self.stage.name}.scan.k{k}"
        synced = (
            self.engine.transaction_version(self.scan_path, app)
            if self.engine.exists(self.scan_path)
            else None
        )
        if synced is not None and synced - 1 == master.version:
            mapping.setdefault(master.version, self.engine.snapshot(self.scan_path).version)
        elif synced is None or synced - 1 < master.version:
            mapping[master.version] = self._sync_scan(
                master, synced, AppTransaction(app, master.version + 1)
            )
        state["scan"] = {str(v): mapping.get(v, -1) for v in sorted(needed)}
        state["scan_partitions"] = k
        return dict(state["scan"])

    def _sync_scan(self, master: Snapshot, synced: int | None, txn: AppTransaction) -> int:
        """Bring the scan copy to ``master``; returns the copy's table version."""
        k = self.params.partitions
        previous = (
            self.engine.snapshot(self.master_path, synced - 1) if synced is not None else None
        )
        now = {f.path: f.num_records for f in master.files}
        appended = previous is not None and all(
            now.get(f.path, -1) == f.num_records for f in previous.files
        )
        if previous is not None and appended:
            known = {f.path for f in previous.files}
            new_files = [f for f in master.files if f.path not in known]
            rows = ssbj.scan_rows(self.engine.read_files(master, new_files), self.spec, k)
            outcome = self.engine.append(self.scan_path, rows, txn)
        else:
            rows = ssbj.scan_rows(self.engine.read_files(master), self.spec, k)
            self.engine.create_table(self.scan_path, rows.schema, (ssbj.SCAN_PART,))
            outcome = self.engine.overwrite(self.scan_path, rows, txn)
        logger.info(
            "ssbj %s: scan copy of master v%d at v%d (%s, k=%d)",
            self.stage.name,
            master.version,
            outcome.table_version,
            "appended" if appended else "rewritten",
            k,
        )
        return outcome.table_version

    def _admit(
        self, state: dict[str, Any], offset: int, latest: int, master: Snapshot
    ) -> Admission:
        """The input versions this step takes under ``operator.memory_bytes`` (Eq. 1)."""
        budget = self.params.memory_bytes
        assert budget is not None
        step = state["next_step"]
        # Look a bounded number of versions ahead: each costs a log read, and a step rarely
        # has room for more (a longer backlog is admitted over the following steps).
        horizon = min(latest, offset + ADMISSION_HORIZON_VERSIONS)
        sizes = self._known_sizes(state)
        if sizes is None:  # the first step: sample the next input (a DataFrame per version)
            sizes = self._sizes(state, self._input_rows(offset, min(horizon, offset + 8)), master)
        k = self.params.partitions
        memory = OperatorMemory(
            disk_buffer_rows=_rows(master.files) / k,
            cache_rows=self._table_rows("cache") if self.use_cache else 0,
            pending_rows=self._table_rows("pending", exclude_entry_step=step - k + 1),
        )
        disk_buffer = memory.disk_buffer_rows * sizes.master_bytes
        if disk_buffer > budget:
            raise ConfigError(
                f"stages[{self.stage.name}].operator.memory_bytes: {budget} bytes cannot hold "
                f"even the disk buffer, one master partition of {memory.disk_buffer_rows:.0f} "
                f"rows x {sizes.master_bytes:.0f} B = {disk_buffer:.0f} bytes; raise "
                "memory_bytes or operator.partitions"
            )
        capacity = chunk_capacity(budget, memory, sizes, k)
        miss_rate = float(state.get("miss_rate", 1.0)) if self.use_cache else 1.0
        admission = admit(
            offset,
            self.engine.rows_by_version(self.input_path, offset, horizon),
            capacity,
            miss_rate,
            nothing_pending=memory.pending_rows == 0,
        )
        log = logger.warning if admission.forced else logger.info
        log(
            "ssbj %s step %d: memory %d B holds %d new H_S tuples beside b=%.0f, H_R=%d, "
            "H_S=%d rows; admitting input v%d..v%d (%d rows, miss rate %.2f%s), %d rows wait",
            self.stage.name,
            step,
            budget,
            capacity,
            memory.disk_buffer_rows,
            memory.cache_rows,
            memory.pending_rows,
            offset + 1,
            admission.to_version,
            admission.admitted_rows,
            miss_rate,
            ", one version beyond the budget so the stage progresses" if admission.forced else "",
            admission.backlog_rows,
        )
        return admission

    def _table_rows(self, table: str, exclude_entry_step: int | None = None) -> int:
        """Rows of an operator table from its file statistics (no data is read)."""
        if not self.engine.exists(self.paths[table]):
            return 0
        files = self.engine.snapshot(self.paths[table]).files
        return _rows(
            f
            for f in files
            if exclude_entry_step is None
            or f.partition_values.get(ssbj.ENTRY_STEP) != exclude_entry_step
        )

    def _chunk_rows(self, entry_step: int) -> int:
        """Rows of one H_S chunk, from the pending table's file statistics."""
        files = self.engine.snapshot(self.paths["pending"]).files
        return _rows(f for f in files if f.partition_values.get(ssbj.ENTRY_STEP) == entry_step)

    def _state_bytes(
        self, state: dict[str, Any], master: Snapshot, pending: int, cache: int
    ) -> float:
        sizes = state.get("sizes")
        if not sizes:
            return 0.0
        memory = OperatorMemory(_rows(master.files) / self.params.partitions, cache, pending)
        return memory.bytes(TupleSizes(sizes["stream"], sizes["master"]))

    def _pins(
        self, state: dict[str, Any], plan: dict[str, Any] | None = None
    ) -> dict[str, list[int]]:
        """The versions this stage still reads by time travel, by table path."""
        master = {int(v) for v in state["chunks"].values()}
        bases = [int(v) for v in (state["cache_version"], state["switch_version"]) if v is not None]
        master.update(bases)
        pins: dict[str, Iterable[int]] = {}
        if plan is not None:
            planned = int(plan["master_version"])
            master.add(planned)
            for base in bases:  # the changes that bring the cache / the buffer to the plan
                master.update(range(base, planned + 1))
            pins.update({self.paths[t]: [int(v)] for t, v in plan["tables"].items()})
            pins[self.input_path] = input_versions(plan["input_from"], plan["input_to"])
        pins[self.master_path] = master
        # The scan copy is read for the chunks' versions, the switching buffer's and the
        # plan's (the cache follows the master's own changes, not the copy).
        scanned = {int(v) for v in state["chunks"].values()}
        scanned.update(int(v) for v in (state["switch_version"],) if v is not None)
        if plan is not None:
            scanned.add(int(plan["master_version"]))
        mapping = {int(v): int(t) for v, t in state.get("scan", {}).items()}
        scan = sorted({mapping[v] for v in scanned if mapping.get(v, -1) >= 0})
        if scan:
            pins[self.scan_path] = scan
        return union_pins(pins)

    def _read(self, table: str, plan: dict[str, Any]) -> DataFrame | None:
        version = plan["tables"].get(table)
        if version is None:
            return None
        return self.engine.read(self.paths[table], version=version)

    # ------------------------------------------------------------------ one step

    def step(self, run_id: str, take_input: bool) -> SsbjStepReport:
        started = time.monotonic()
        state = self._state()
        position = self._position(state)
        plan = self._plan(state, take_input)
        step = plan["step"]
        version = plan["master_version"]
        master = self.engine.snapshot(self.master_path, version)
        report = SsbjStepReport(
            self.stage.name,
            step,
            master_version=version,
            state=position.state.value,
            memory_bytes=self.params.memory_bytes,
            backlog_rows=int(plan.get("backlog_rows", 0)),
        )
        txn = lambda table: AppTransaction(f"ssbj.{self.stage.name}.{table}", step)  # noqa: E731

        new_rows = self._suppressed(self._new_rows(plan), state).cache()
        sizes = self._sizes(state, new_rows, master)

        cache, cache_changed = self._cache_at(state, plan, master)
        cache_version_before = state["cache_version"]
        if self.use_cache and position.starts_cycle:
            cache, cycle_changed = self._cycle_start(
                state, plan, position, cache, master, sizes, txn
            )
            cache_changed = cache_changed or cycle_changed

        served, misses, hits = self._cache_phase(new_rows, cache, version)
        # Counts for the report ride on the writes (observed metrics), not extra jobs.
        hit_total = _Observed(hits, F.sum(ssbj.COUNT))
        hits = hit_total.frame
        served_unmatched = None
        if self.spec.how == "left":
            served_unmatched = _Observed(
                served, F.sum(F.when(F.col(self.spec.version).isNull(), 1).otherwise(0))
            )
            served = served_unmatched.frame
        chunk = (
            misses.withColumn(ssbj.ENTRY_STEP, F.lit(step).cast(T.LongType()))
            .withColumn(ssbj.PENDING_ID, F.monotonically_increasing_id())
            .withColumn(ssbj.PINNED_VERSION, F.lit(version).cast(T.LongType()))
        )
        self.engine.create_table(self.paths["pending"], chunk.schema, (ssbj.ENTRY_STEP,))
        self.engine.append(self.paths["pending"], chunk, txn("pending"))
        crash_point("ssbj.after_pending")
        chunks = {**state["chunks"]}
        chunks[str(step)] = version
        pending = self._suppressed(self.engine.read(self.paths["pending"]), state).cache()
        if self.use_cache and position.starts_cycle and position.state is CycleState.SWITCHING:
            self._mark_for_switching(state, plan, position, pending, cache, master, sizes, txn)

        disk_output, matched_now, bytes_read, partition_at = self._disk_phase(
            pending, chunks, position, master, plan["scan"]
        )
        report.master_bytes_read = bytes_read
        expiring_step = step - position.partitions + 1
        unmatched = self._expire(pending, matched_now, plan, expiring_step)

        output = served.unionByName(disk_output)
        if unmatched is not None:
            output = output.unionByName(unmatched)
        self.engine.create_table(self.output_path, output.schema, (INTERVAL_START,))
        outcome = self.engine.append(
            self.output_path, output, AppTransaction(f"stage.{self.stage.name}", step + 1)
        )
        if outcome.committed:
            report.output_version = outcome.table_version
            report.output_rows = outcome.rows_added
        if served_unmatched is not None:
            report.cache_hits_unmatched = served_unmatched.value(outcome.committed)
        crash_point("ssbj.after_output")
        stats_written = self._write_stats(position, plan, pending, hits, partition_at, state, txn)
        report.cache_hits = hit_total.value(stats_written) if self.use_cache else 0
        # The chunk's rows, from the pending table's file statistics: no job, and the same
        # answer when a rerun finds the chunk already committed.
        report.entered_pending = self._chunk_rows(step)
        report.tuples_in = report.entered_pending + report.cache_hits
        if self.spec.how == "left":
            self._append_keyed("matched", matched_now, (ssbj.ENTRY_STEP,), txn("matched"))
        crash_point("ssbj.after_stats")
        if self.use_cache and (cache_changed or state["cache_version"] is None):
            self._write_cache(cache, txn("cache"))
        crash_point("ssbj.after_cache")
        if str(expiring_step) in chunks:
            where = [PartitionFilter(ssbj.ENTRY_STEP, "=", expiring_step)]
            report.expired = self._chunk_rows(expiring_step)
            self.engine.delete_partitions(self.paths["pending"], where, txn("expire"))
            if self.spec.how == "left" and self.engine.exists(self.paths["matched"]):
                self.engine.delete_partitions(self.paths["matched"], where, txn("expire"))
            chunks.pop(str(expiring_step))
        crash_point("ssbj.before_complete")

        if report.entered_pending == 0:
            # This step's chunk is empty (misses and hits partition the new tuples exactly):
            # later steps need not read its master version, and nothing pins it.
            chunks.pop(str(step), None)
        state["chunks"] = chunks
        state["cache_version"] = version if self.use_cache else None
        state["next_step"] = step + 1
        state["plan"] = None
        pending_snapshot = self.engine.snapshot(self.paths["pending"])
        report.pending_rows = sum(f.num_records or 0 for f in pending_snapshot.files)
        report.pending_bytes = pending_snapshot.size_bytes
        if self.engine.exists(self.paths["cache"]):
            cache_snapshot = self.engine.snapshot(self.paths["cache"])
            report.cache_rows = sum(f.num_records or 0 for f in cache_snapshot.files)
            report.cache_bytes = cache_snapshot.size_bytes
        if report.tuples_in:
            state["miss_rate"] = report.entered_pending / report.tuples_in
        report.state_bytes = self._state_bytes(
            state, master, report.pending_rows, report.cache_rows if self.use_cache else 0
        )
        report.seconds = time.monotonic() - started
        self.store.complete_step(self.stage.name, plan["input_to"], step + 1, state)
        self.store.set_pins(ssbj_holder(self.stage.name), self._pins(state))
        self.store.record_metrics(run_id, self.stage.name, step + 1, report.as_metrics())
        for frame in (new_rows, pending):
            frame.unpersist()
        if report.memory_bytes is not None and report.state_bytes > report.memory_bytes:
            logger.warning(
                "ssbj %s step %d: state %.0f B exceeds memory_bytes %d B (the cache grew, or "
                "more tuples missed it than the last step's miss rate predicted)",
                self.stage.name,
                step,
                report.state_bytes,
                report.memory_bytes,
            )
        logger.info(
            "ssbj %s step %d (%s, partition %d/%d): %d in, %d cache hits, %d to H_S, %d expired, "
            "%d out; H_S %d rows, H_R %d rows; master v%d (cache was v%s) %.1fs",
            self.stage.name,
            step,
            position.state.value,
            position.partition + 1,
            position.partitions,
            report.tuples_in,
            report.cache_hits,
            report.entered_pending,
            report.expired,
            report.output_rows,
            report.pending_rows,
            report.cache_rows,
            version,
            cache_version_before,
            report.seconds,
        )
        return report

    # ------------------------------------------------------------------ phases

    def _new_rows(self, plan: dict[str, Any]) -> DataFrame:
        return self._input_rows(plan["input_from"], plan["input_to"])

    def _suppressed(self, frame: DataFrame, state: dict[str, Any]) -> DataFrame:
        """Drop tuples whose interval a backfill has already joined and published."""
        for backfill in state.get("backfills", []):
            covered = (
                (F.col(INTERVAL_START) >= F.lit(backfill["start"]).cast(T.TimestampType()))
                & (F.col(INTERVAL_START) < F.lit(backfill["end"]).cast(T.TimestampType()))
                & (F.col(ssbj.INPUT_VERSION) <= F.lit(backfill["input_version"]))
            )
            frame = frame.where(~covered)
        return frame

    @staticmethod
    def _known_sizes(state: dict[str, Any]) -> TupleSizes | None:
        if state.get("sizes"):
            return TupleSizes(state["sizes"]["stream"], state["sizes"]["master"])
        return None

    def _sizes(self, state: dict[str, Any], rows: DataFrame, master: Snapshot) -> TupleSizes:
        """v_S and v_R measured as Arrow bytes of sampled projected rows, once per stage."""
        known = self._known_sizes(state)
        if known is not None:
            return known
        stream_bytes = measured_row_bytes(rows.drop(*ssbj.OPERATOR_COLUMNS))
        master_bytes = measured_row_bytes(
            self.engine.read_files(master).select(*self.spec.master_columns)
        )
        if stream_bytes is None or master_bytes is None:
            return TupleSizes(1.0, 1.0)  # nothing to measure yet; measured on a later step
        sizes = TupleSizes(stream_bytes, master_bytes)
        state["sizes"] = {"stream": sizes.stream_bytes, "master": sizes.master_bytes}
        logger.info(
            "ssbj %s: measured v_S=%.1f B, v_R=%.1f B", self.stage.name, *state["sizes"].values()
        )
        return sizes

    def _empty_cache(self, master: Snapshot) -> DataFrame:
        schema = T.StructType(
            [master.schema[c] for c in self.spec.master_columns]
            + [T.StructField(ssbj.EMPTY, T.BooleanType(), False)]
        )
        return self.spark.createDataFrame([], schema)

    def _cache_at(
        self, state: dict[str, Any], plan: dict[str, Any], master: Snapshot
    ) -> tuple[DataFrame, bool]:
        cache = self._read("cache", plan)
        if cache is None or not self.use_cache:
            return self._empty_cache(master), False
        if state["cache_version"] == master.version:
            return cache, False
        return self._entries_at(cache, state["cache_version"], master), True

    def _entries_at(self, entries: DataFrame, version: int, master: Snapshot) -> DataFrame:
        """Cache entries of master ``version`` brought to the ``master`` snapshot's version.

        From the rows the commits in between changed when the master says (its change data
        feed, or added files only); otherwise, after an overwrite or a compaction by a
        writer without the change feed, by reading the entries' values again at the new
        version. Tuples pinned to older versions are unaffected: they read those versions.
        """
        try:
            changes = self.engine.changes(self.master_path, version, master.version)
        except NotAppendOnlyError as e:
            logger.info(
                "ssbj %s: master %s changed between v%d and v%d without a change feed (%s); "
                "reading the cached values again at v%d",
                self.stage.name,
                self.master_path,
                version,
                master.version,
                e,
                master.version,
            )
            return ssbj.reload_cached_values(entries, self.engine.read_files(master), self.spec)
        return ssbj.apply_master_changes(entries, changes, CHANGE_TYPE, self.spec)

    def _cycle_start(
        self,
        state: dict[str, Any],
        plan: dict[str, Any],
        position: StepPosition,
        cache: DataFrame,
        master: Snapshot,
        sizes: TupleSizes,
        txn: Any,
    ) -> tuple[DataFrame, bool]:
        changed = False
        if position.state is CycleState.PHASE_OUT and state["switch_version"] is not None:
            marked = self._read("marked", plan)
            collected = self._read("switch", plan)
            if marked is not None and collected is not None:
                entries = ssbj.cache_rows_for(marked, collected.drop(ssbj.STEP), self.spec)
                if state["switch_version"] != master.version:
                    entries = self._entries_at(entries, state["switch_version"], master)
                cache = ssbj.without_keys(cache, marked, self.spec).unionByName(entries)
                changed = True
                for table, frame in (("switch", collected), ("marked", marked)):
                    self.engine.overwrite(self.paths[table], frame.limit(0), txn(f"{table}-clear"))
            state["switch_version"] = None
        if position.evicts:
            stats = self._read("stats", plan)
            if stats is not None:
                hits = stats.where(
                    (F.col(ssbj.KIND) == ssbj.HIT) & (F.col(ssbj.STEP) >= state["hits_since"])
                )
                victims = ssbj.eviction_victims(
                    cache,
                    hits,
                    self.spec,
                    sizes,
                    self.params.switch_factor,
                    self.params.eviction_cycles,
                )
                cache = ssbj.without_keys(cache, victims, self.spec)
                changed = True
            state["hits_since"] = plan["step"]
        return cache, changed

    def _mark_for_switching(
        self,
        state: dict[str, Any],
        plan: dict[str, Any],
        position: StepPosition,
        pending: DataFrame,
        cache: DataFrame,
        master: Snapshot,
        sizes: TupleSizes,
        txn: Any,
    ) -> None:
        """Line 33 at the first step of the switching cycle, over H_S with this step's chunk."""
        stats = self._read("stats", plan)
        counts = (
            stats.where(
                (F.col(ssbj.KIND) == ssbj.MASTER_ROWS)
                & (F.col(ssbj.STEP) >= plan["step"] - position.partitions)
            )
            if stats is not None
            else self.spark.createDataFrame(
                [], pending.select(*self.spec.stream_keys).schema
            ).withColumn(ssbj.COUNT, F.lit(0).cast(T.LongType()))
        )
        cached_keys = cache.select(*self.spec.master_keys_as_stream()).distinct()
        marked = ssbj.switch_candidates(
            pending,
            counts,
            cached_keys,
            self.spec,
            sizes,
            self.params.switch_factor,
            position.partitions,
            self.params.scount_estimator,
        )
        self._overwrite("marked", marked, txn("marked"))
        state["switch_version"] = master.version

    def _cache_phase(
        self, new_rows: DataFrame, cache: DataFrame, version: int
    ) -> tuple[DataFrame, DataFrame, DataFrame]:
        if not self.use_cache:
            served = ssbj.enriched(
                new_rows.limit(0), cache.drop(ssbj.EMPTY), self.spec, F.lit(version)
            )
            counts = (
                new_rows.limit(0).select(*self.spec.stream_keys).withColumn(ssbj.COUNT, F.lit(0))
            )
            return served, new_rows, counts
        return ssbj.probe_cache(new_rows, cache, self.spec, version)

    def _partition(
        self, snapshot: Snapshot, index: int, parts: int, scan: dict[str, int]
    ) -> tuple[DataFrame, int]:
        """Partition ``index`` of k of a master version: its rows and the bytes read."""
        scan_version = scan.get(str(snapshot.version), -1)
        if scan_version >= 0:
            copy = self.engine.snapshot(self.scan_path, scan_version)
            chosen = [f for f in copy.files if f.partition_values.get(ssbj.SCAN_PART) == index]
            rows = self.engine.read_files(copy, chosen)
        else:  # a version pinned before the scan copy existed: split its files by bytes
            groups = partition_by_bytes([(f.path, f.size_bytes) for f in snapshot.files], parts)
            chosen = [f for f in snapshot.files if f.path in set(groups[index])]
            rows = self.engine.read_files(snapshot, chosen)
        return rows.select(*self.spec.master_columns), sum(f.size_bytes for f in chosen)

    def _disk_phase(
        self,
        pending: DataFrame,
        chunks: dict[str, int],
        position: StepPosition,
        master: Snapshot,
        scan: dict[str, int],
    ) -> tuple[DataFrame, DataFrame, int, dict[int, DataFrame]]:
        outputs: list[DataFrame] = []
        matched: list[DataFrame] = []
        partitions: dict[int, DataFrame] = {}
        bytes_read = 0
        for pinned in sorted(set(chunks.values())):
            snapshot = (
                master
                if pinned == master.version
                else self.engine.snapshot(self.master_path, pinned)
            )
            rows, size = self._partition(snapshot, position.partition, position.partitions, scan)
            partitions[pinned] = rows
            bytes_read += size
            mine = pending.where(F.col(ssbj.PINNED_VERSION) == pinned)
            outputs.append(ssbj.disk_join(mine, rows, self.spec))
            if self.spec.how == "left":
                matched.append(ssbj.matched_ids(mine, rows, self.spec))
        if master.version not in partitions and self.use_cache:
            rows, size = self._partition(master, position.partition, position.partitions, scan)
            partitions[master.version] = rows
        empty_out = ssbj.enriched(
            pending.limit(0), self._empty_cache(master).drop(ssbj.EMPTY), self.spec, F.lit(0)
        )
        output = empty_out
        for frame in outputs:
            output = output.unionByName(frame)
        matched_frame = pending.limit(0).select(ssbj.ENTRY_STEP, ssbj.PENDING_ID)
        for frame in matched:
            matched_frame = matched_frame.unionByName(frame)
        return output, matched_frame, bytes_read, partitions

    def _expire(
        self, pending: DataFrame, matched_now: DataFrame, plan: dict[str, Any], expiring_step: int
    ) -> DataFrame | None:
        if self.spec.how != "left" or expiring_step < 0:
            return None
        expiring = pending.where(F.col(ssbj.ENTRY_STEP) == expiring_step)
        earlier = self._read("matched", plan)
        matched = matched_now
        if earlier is not None:
            matched = matched.unionByName(earlier.where(F.col(ssbj.ENTRY_STEP) == expiring_step))
        master_schema = self.engine.snapshot(self.master_path, plan["master_version"]).schema
        return ssbj.unmatched(ssbj.never_matched(expiring, matched), master_schema, self.spec)

    # ------------------------------------------------------------------ writes

    def _write_stats(
        self,
        position: StepPosition,
        plan: dict[str, Any],
        pending: DataFrame,
        hits: DataFrame,
        partitions: dict[int, DataFrame],
        state: dict[str, Any],
        txn: Any,
    ) -> bool:
        """Append this step's counters (and switching-buffer rows); True if the hits were
        written by this call (False when a rerun found them committed)."""
        if not self.use_cache:
            return False
        step = plan["step"]
        frames = [hits.withColumn(ssbj.KIND, F.lit(ssbj.HIT))]
        current = partitions.get(plan["master_version"])
        if position.state is CycleState.INCREMENTING and current is not None:
            keys = pending.select(*self.spec.stream_keys).distinct()
            counts = ssbj.master_row_counts(current, keys, self.spec)
            frames.append(counts.withColumn(ssbj.KIND, F.lit(ssbj.MASTER_ROWS)))
        stats = frames[0]
        for frame in frames[1:]:
            stats = stats.unionByName(frame)
        stats = stats.withColumn(ssbj.STEP, F.lit(step).cast(T.LongType())).withColumn(
            ssbj.COUNT, F.col(ssbj.COUNT).cast(T.LongType())
        )
        written = self._append_keyed("stats", stats, (ssbj.STEP,), txn("stats")).committed
        if position.state is CycleState.SWITCHING and state["switch_version"] is not None:
            marked = self._read(
                "marked", {"tables": {**plan["tables"], **self._fresh(("marked",))}}
            )
            source = partitions.get(state["switch_version"])
            if marked is not None and source is not None:
                renamed = marked.select(*self.spec.stream_keys_as_master())
                rows = source.join(renamed, list(self.spec.master_keys), "left_semi").withColumn(
                    ssbj.STEP, F.lit(step).cast(T.LongType())
                )
                self._append_keyed("switch", rows, (ssbj.STEP,), txn("switch"))
        return written

    def _fresh(self, tables: tuple[str, ...]) -> dict[str, int]:
        return {
            t: self.engine.snapshot(self.paths[t]).version
            for t in tables
            if self.engine.exists(self.paths[t])
        }

    def _append_keyed(
        self, table: str, frame: DataFrame, partition_by: tuple[str, ...], txn: AppTransaction
    ) -> CommitOutcome:
        self.engine.create_table(self.paths[table], frame.schema, partition_by)
        return self.engine.append(self.paths[table], frame, txn)

    def _overwrite(self, table: str, frame: DataFrame, txn: AppTransaction) -> None:
        self.engine.create_table(self.paths[table], frame.schema)
        self.engine.overwrite(self.paths[table], frame, txn)

    def _write_cache(self, cache: DataFrame, txn: AppTransaction) -> None:
        self._overwrite("cache", cache, txn)


def _rows(files: Iterable[Any]) -> int:
    return sum(f.num_records or 0 for f in files)


class _Observed:
    """One aggregate of a frame, observed while a write computes the frame.

    Read it with :meth:`value` after the write: from the observation when the write ran,
    otherwise (a rerun that found the write committed) by one aggregation job.
    """

    def __init__(self, frame: DataFrame, aggregate: Column) -> None:
        self._source = frame
        self._aggregate = aggregate
        self._observation = Observation()
        self.frame = frame.observe(self._observation, aggregate.alias("value"))

    def value(self, computed: bool) -> int:
        if computed:
            result = self._observation.get.get("value")
        else:
            row = self._source.agg(self._aggregate.alias("value")).first()
            result = row["value"] if row else None
        return int(result or 0)
