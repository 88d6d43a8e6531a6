"""The stateful SSBJ / MESHJOIN operator (driven by ``pipeline.ssbj.driver``): one Algorithm 1
loop iteration per step.

Operator state lives in two Delta tables under ``_operators/<stage>/``:

``state``  everything Algorithm 1 keeps between steps, one row per item with a ``_role``
           (see ``joins.ssbj.buckets``): the pending tuples of H_S with their entry step,
           pinned master version and matched flag; the cache H_R at the cache's master
           version (a value without master rows as one empty-entry row); the per-value
           counters f_count and s_count; the values marked for switching and the rows of
           the switching buffer s_B. Each step rewrites it in one commit.
``scan``   the operator's copy of the master for the cyclic scan, partitioned by
           ``_scan_part`` = hash(row) mod k, so partition p of every version holds |R|/k
           rows however the master's writer laid out its files (see :meth:`_scan_versions`)

and small controller state (step counter, versions, chunk pins, row counts) in the state
store.

A step is one pass over the data (``joins.ssbj.step``: the new tuples, the state, master
partition ``step mod k`` of each version the step needs and the master's changes, grouped
by a hash of the join value, Algorithm 1 per bucket), then two commits: the output rows
and the new state. Counts for the metrics come out of the same pass.

Version pins (holder ``ssbj.<stage>``, see :mod:`pipeline.pins`): the master versions that
pending chunks are pinned to and that the cache and the switching buffer are at; while a
step's plan is open also the plan's master version, the master versions whose changes bring
the cache and the buffer to it, the state table's version and the input versions. The pins
are set before the plan is saved (a rerun after a crash reads exactly those versions) and
replaced by the completed state's pins when the step completes.

Exactly once: before anything is written, the step's plan (input range, master version,
state table version, scan copy versions) is saved. All reads use those pinned versions and
the result is a function of them, both writes carry the app transaction of the step, and
the step is completed in one state-store transaction. A rerun after a crash anywhere
recomputes the same result and skips the writes that landed.

Point in time: each tuple is pinned to the master version in force when it entered; the
disk phase reads partition p of that version by time travel until the tuple expires. The
cache is brought to the current version from the master's changes before it serves.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import ConfigError, JoinError, NotAppendOnlyError
from common.faults import crash_point
from joins.columns import INTERVAL_START
from joins.ssbj.algorithm import Schedule, StepCounts, StepPlan, schedule
from joins.ssbj.buckets import (
    KEY_LOAD,
    KEY_SKETCH,
    LATE_MIN_METRICS,
    METRIC_ROLE,
    PENDING,
    ROLE,
    BucketDeltas,
    stream_field,
)
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.intake import Admission, OperatorMemory, admit, chunk_capacity
from joins.ssbj.cache.rcycle import CycleState, StepPosition
from joins.ssbj.late import LATE_SINCE, LateRule
from joins.ssbj.mesh_partitions import partition_by_bytes
from joins.ssbj.skew.asketch import ASketch, SketchShape
from joins.ssbj.skew.key_routing import BucketLoad, KeyRouting, moves_of, rebalance
from joins.ssbj.step import (
    INPUT_VERSION,
    SCAN_PART,
    JoinSpec,
    WideTable,
    bucket_loads,
    scan_rows,
    state_of,
    state_of_arrow,
    summary_of,
    summary_rows_arrow,
)
from pipeline.config import EquiStage, PipelineConfig
from pipeline.layout import WarehouseLayout
from pipeline.pins import input_versions, ssbj_holder, union_pins
from pipeline.row_bytes import measured_row_bytes
from warehouse.delta import AppTransaction, CommitOutcome, DataFile, DeltaEngine, Snapshot
from warehouse.delta.api import CHANGE_TYPE
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)

STATE_TABLE = "state"
SCAN_TABLE = "scan"
TABLES = (STATE_TABLE,)
OWNED_TABLES = (STATE_TABLE, SCAN_TABLE)
ADMISSION_HORIZON_VERSIONS = 256
# The master partition is semi-joined to the join values the step's tuples ask for (a
# distinct and a join, one more Spark job) only when it holds more than this many rows per
# asking tuple; a smaller one goes to the buckets whole, where Arrow drops the rows no
# tuple asks for before any is decoded (measured on a 6-tuple step: the semi-join's job
# was 0.5 s of 3.7 s; at SF10 a partition of 1M rows for 80k tuples still pays for it).
SEMI_JOIN_ROWS_PER_TUPLE = 10
# (pinned master version, the table version read, its files) of a step's master partitions.
PartitionScans = list[tuple[int, Snapshot, list[DataFile]]]
# The operator-state layout this driver writes; state without it is from a release that
# kept H_S, H_R and the counters in separate tables.
STATE_LAYOUT = 2
# What a failed collect of a step's result raises (through py4j, converted or not).
_COLLECT_ERRORS: tuple[type[Exception], ...] = (PySparkException, Py4JError, MemoryError)


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
    master_rows_read: int = 0  # b of Eq. 1-2: the rows of the master partition scanned
    master_version: int = 0
    output_version: int | None = None
    seconds: float = 0.0
    state: str = ""
    state_bytes: float = 0.0  # Eq. 1 at the end of the step: (b + h_R)·v_R + |H_S|·v_S
    memory_bytes: int | None = None  # the budget M, when one is set
    backlog_rows: int = 0  # input rows left waiting for a later step by the budget
    # FastJoin's Eq. 2 over the key buckets' loads this step, before and after the moves
    # the monitor planned for the next step (equal when nothing moved)
    load_imbalance: float = 1.0
    load_imbalance_after: float = 1.0
    moved_keys: int = 0
    moved_tuples: int = 0  # migration volume: state rows of the moved keys
    routed_keys: int = 0  # keys away from their home bucket in the next step's routing
    split_keys: int = 0  # hot keys spread over several buckets in the next step's routing
    counter_rows: int = 0  # join values with counters in the state after the step
    tracked_keys: int = 0  # key_counts: sketch: the values the step counted (0 for exact)
    sketch_bytes: int = 0  # key_counts: sketch: the merged sketch's size
    # Tuples that met no master row and wait for a newer version (``joins.ssbj.late``).
    # Of the counts above (``tuples_in`` excepted, which counts the step's new input only),
    # these many returned from the late rows; then how many answered from H_R, unmatched.
    returned: int = 0
    returned_hits: int = 0
    returned_hits_unmatched: int = 0
    late_waits: bool = False  # the stage keeps such tuples (``operator.late_master``)
    late_entered: int = 0  # new input that met no row and waits
    late_answered: int = 0  # tuples that had waited, answered this step
    late_expired: int = 0  # tuples that had waited, whose wait ended unanswered
    late_rows: int = 0  # late rows in the state after the step
    late_waiting: int = 0  # tuples waiting after the step: late rows and returned ones in H_S
    late_oldest_us: int | None = None  # when the longest-waiting of them first met no row
    late_min_version: int | None = None  # the oldest version a late row met no row at

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
            "master_rows_read": self.master_rows_read,
            "master_version": self.master_version,
            "step_seconds": self.seconds,
            "state_bytes": self.state_bytes,
            "backlog_rows": self.backlog_rows,
            "load_imbalance": _finite(self.load_imbalance),
            "load_imbalance_after": _finite(self.load_imbalance_after),
            "moved_keys": self.moved_keys,
            "moved_tuples": self.moved_tuples,
            "routed_keys": self.routed_keys,
            "split_keys": self.split_keys,
            "counter_rows": self.counter_rows,
            "tracked_keys": self.tracked_keys,
            "sketch_bytes": self.sketch_bytes,
            # Conservation view: every tuple in is served by the cache or waits.
            "tuples_matched": self.new_matched,
            "tuples_unmatched": self.new_unmatched,
            "tuples_pending": self.new_pending,
        }
        if self.late_waits or self.late_waiting or self.late_expired:
            values.update(
                late_waiting=self.late_waiting,
                late_answered=self.late_answered,
                late_expired=self.late_expired,
                late_entered=self.late_entered,
            )
        if self.output_version is not None:
            values["output_version"] = self.output_version
        if self.memory_bytes is not None:
            values["memory_bytes"] = self.memory_bytes
        return values

    @property
    def new_matched(self) -> int:
        """New input tuples answered from H_R at entry (returned ones not counted)."""
        hits = self.cache_hits - self.cache_hits_unmatched
        return hits - (self.returned_hits - self.returned_hits_unmatched)

    @property
    def new_pending(self) -> int:
        """New input tuples that entered H_S, and (keeping late tuples) those H_R answered
        with no row, which wait as late rows: from the counters, not by difference, so
        that the conservation check can fail."""
        entered = self.entered_pending - (self.returned - self.returned_hits)
        fresh = self.cache_hits_unmatched - self.returned_hits_unmatched
        return entered + (fresh if self.late_waits else 0)

    @property
    def new_unmatched(self) -> int:
        """New input tuples H_R answered with no row, emitted or dropped at once: unless
        they wait for a late master row (then they are pending)."""
        fresh = self.cache_hits_unmatched - self.returned_hits_unmatched
        return 0 if self.late_waits else fresh


def _finite(value: float) -> float:
    """A metric value the metrics table can hold: an idle bucket beside a busy one makes
    LI infinite (Eq. 2), recorded as -1."""
    return value if math.isfinite(value) else -1.0


def held_back(state: dict[str, Any] | None) -> str | None:
    """What the controller ``state`` still holds that a later step must finish, or None:
    tuples waiting in H_S (their chunks), a step that was planned and not completed, or
    tuples waiting for late master rows.

    Such a stage must keep its SSBJ driver until a drain empties it (``pipeline.drivers``).
    """
    if not state:
        return None
    if state.get("chunks"):
        return f"{int(state.get('pending_rows', 0))} tuple(s) wait in H_S"
    if state.get("plan"):
        return f"its step {state.get('next_step')} was planned and not completed"
    if int(state.get("late_rows", 0)):
        return (
            f"{int(state['late_rows'])} tuple(s) wait for late master rows (they expire at "
            "the next step once operator.late_master is removed)"
        )
    return None


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
        input_rows_arrow: Callable[[int, int], pa.Table] | None = None,
    ) -> None:
        self.stage = stage
        self.spark = spark
        self.engine = engine
        self.store = store
        self.params = stage.operator
        self.use_cache = self.params.mode in ("ssbj", "auto")  # auto runs this when SSBJ
        layout = WarehouseLayout.of(config)
        self.master_path = layout.master(config, stage.master)
        self.output_path = output_path
        self.input_path = input_path
        self.paths = {t: layout.operator_state(stage.name, t) for t in TABLES}
        self.state_path = self.paths[STATE_TABLE]
        self.scan_path = layout.operator_state(stage.name, SCAN_TABLE)
        self.spec = JoinSpec(
            stream_keys=tuple(stage.join_on),
            master_keys=tuple(stage.join_on.values()),
            master_columns=tuple(config.masters[stage.master].columns),
            master_name=stage.master,
            how=stage.join,
        )
        # (after_version, to_version) -> new input rows with _input_version and _interval_start
        self._input_rows = input_rows
        # The same rows in the driver's memory, for a step that runs there (``_in_driver``).
        self._input_rows_arrow = input_rows_arrow

    # ------------------------------------------------------------------ public API

    def run(
        self, run_id: str, drain: bool = False, steps: int | None = None
    ) -> list[SsbjStepReport]:
        """``steps`` steps (default ``operator.steps_per_run``), fewer when idle; then, with
        ``drain``, steps without new input until nothing is pending."""
        # Under a memory budget the backlog enters a step at a time, so every step takes
        # the input that fits; otherwise the run's first step takes all of it.
        budgeted = self.params.memory_bytes is not None
        reports: list[SsbjStepReport] = []
        if steps is not None and steps < 1:
            raise ConfigError(f"steps: expected a whole number >= 1, found {steps}")
        for index in range(self.params.steps_per_run if steps is None else steps):
            take_input = index == 0 or budgeted
            state = self._state()  # one read a step: the idle check and the step share it
            if self.idle(take_input, state):
                # Nothing pending and nothing new: a step would only rewrite the same
                # state. The operator pauses where it is (the cycle position, the cache
                # and its version stay; the next step brings the cache forward).
                logger.info(
                    "ssbj %s: nothing pending and no input to take; no step taken",
                    self.stage.name,
                )
                break
            reports.append(self.step(run_id, take_input, state))
        if drain:
            state = self._state()
            while int(state.get("pending_rows", 0)) > 0:
                reports.append(self.step(run_id, False, state))
                state = self._state()
        return reports

    def idle(self, take_input: bool, state: dict[str, Any] | None = None) -> bool:
        """True when a step from ``state`` (the controller state, read when not given)
        would have nothing to do: no tuple waits in H_S, no step is half done and (if the
        step would take input) no input version is new."""
        state = self._state() if state is None else state
        if state.get("chunks") or state.get("plan") or self._late_rows_due(state):
            return False
        if not take_input or not self.engine.exists(self.input_path):
            return True
        offset = self.store.offset(self.stage.name)
        return self.engine.snapshot(self.input_path).version <= offset.input_version

    def _late_rows_due(self, state: dict[str, Any]) -> bool:
        """Whether a late row would return (the master has a version newer than one a late
        row met no row at) or expire (the longest wait is over) at a step now."""
        if not int(state.get("late_rows", 0)):
            return False
        oldest, version = state.get("late_oldest_us"), state.get("late_min_version")
        if version is None or oldest is None:
            return True
        if self.engine.snapshot(self.master_path).version > int(version):
            return True
        return int(oldest) <= _now_us() - self._wait_us()

    def _wait_us(self) -> int:
        late = self.params.late_master
        return int(late.wait_delta.total_seconds() * 1_000_000) if late is not None else 0

    def _late_rule(self, state: dict[str, Any], plan: dict[str, Any]) -> LateRule | None:
        """How the step settles tuples no master row answered, when the stage keeps them
        waiting or late rows are left from when it did (``joins.ssbj.late``), by the
        plan's time and wait (``None``: no ``late_master``, every waiting tuple expires)."""
        wait = plan.get("late_wait_us")
        if wait is None and not int(state.get("late_rows", 0)):
            return None
        return LateRule(
            # A plan saved by a release without late rows has no time: none are settled.
            at_us=int(plan.get("at_us") or _now_us()),
            wait_us=int(wait or 0),
            left_join=self.spec.how == "left",
            master_version=int(plan["master_version"]),
        )

    def pending_rows(self) -> int:
        """Tuples in H_S after the last completed step (from the controller state)."""
        state = self.store.operator_state(self.stage.name)
        return int(state.get("pending_rows", 0)) if state else 0

    def state_frame(self) -> DataFrame | None:
        """The operator state table at its latest version, or None before the first step."""
        if not self.engine.exists(self.state_path):
            return None
        return self.engine.read(self.state_path)

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
        if state is not None and state.get("layout") != STATE_LAYOUT:
            return self._from_earlier_release(state)
        # The output's app transactions are numbered by step, and steps of another driver
        # (an auto stage that ran the plain join meanwhile) advanced the offset's step
        # count: SSBJ continues above it, or its next commit would be skipped as done.
        done = self.store.offset(self.stage.name).step_seq
        if state is None:
            return self._fresh_state(next_step=done)
        shift = done - int(state["next_step"])
        if shift > 0 and not held_back(state):
            logger.info(
                "stage %s: SSBJ resumes at step %d after %d step(s) of the plain join",
                self.stage.name,
                done,
                shift,
            )
            state["next_step"] = done
            state["cycle_base"] = int(state["cycle_base"]) + shift
        return state

    def _fresh_state(self, next_step: int) -> dict[str, Any]:
        return {
            "layout": STATE_LAYOUT,
            "next_step": next_step,
            "cycle_base": next_step,
            "partitions": self.params.partitions,
            "cache_version": None,
            "switch_version": None,
            "chunks": {},
            "chunk_rows": {},
            "pending_rows": 0,
            "cache_rows": 0,
            "backfills": [],
            "sizes": None,
            "plan": None,
        }

    def _from_earlier_release(self, earlier: dict[str, Any]) -> dict[str, Any]:
        """Carry on from operator state that kept H_S, H_R and the counters in separate
        tables: only when nothing waits there and no step is half done.

        The step numbering continues (the output's app transactions are numbered by step),
        the R-cycle restarts at this step, and backfill suppressions and the scan copy are
        kept; the cache refills over the next cycles.
        """
        name = self.stage.name
        if earlier.get("chunks") or earlier.get("plan"):
            what = (
                f"{len(earlier['chunks'])} chunk(s) of tuples are still pending there"
                if earlier.get("chunks")
                else f"its step {earlier.get('next_step')} was interrupted"
            )
            raise JoinError(
                f"stage {name}: its operator state is from an earlier release (separate "
                f"pending/cache tables) and {what}; run `enrich drain` with that release first "
                "(nothing is read or changed until then)"
            )
        logger.warning(
            "stage %s: operator state from an earlier release with nothing pending; "
            "continuing at step %s with a fresh cache (it refills over the next cycles)",
            name,
            earlier.get("next_step", 0),
        )
        state = self._fresh_state(int(earlier.get("next_step", 0)))
        for kept in ("backfills", "sizes", "scan", "scan_partitions"):
            if earlier.get(kept) is not None:
                state[kept] = earlier[kept]
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
            # The step's time and the stage's wait: late tuples are settled by them, and a
            # rerun of the step (even after a config edit) settles them alike.
            "at_us": _now_us(),
            "late_wait_us": self._wait_us() if self.params.late_master is not None else None,
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
        if state["switch_version"] is not None:
            needed.add(int(state["switch_version"]))
        plan["scan"] = self._scan_versions(state, master, needed)
        state["plan"] = plan
        # Pins first: a crash before the plan is saved leaves pins the next plan replaces.
        self.store.set_pins(
            ssbj_holder(self.stage.name), self._pins(state, int(plan["input_from"]), plan)
        )
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
            rows = scan_rows(self.engine.read_files(master, new_files), self.spec, k)
            outcome = self.engine.append(self.scan_path, rows, txn)
        else:
            rows = scan_rows(self.engine.read_files(master), self.spec, k)
            self.engine.create_table(self.scan_path, rows.schema, (SCAN_PART,))
            outcome = self.engine.overwrite(self.scan_path, rows, txn)
        crash_point("ssbj.after_scan_sync")
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
        # The chunk that expires at the end of this step leaves room for this step's chunk.
        expiring = int(state.get("chunk_rows", {}).get(str(step - k + 1), 0))
        memory = OperatorMemory(
            disk_buffer_rows=_rows(master.files) / k,
            cache_rows=int(state.get("cache_rows", 0)) if self.use_cache else 0,
            pending_rows=max(0, int(state.get("pending_rows", 0)) - expiring),
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

    def _pins(
        self, state: dict[str, Any], consumed: int, plan: dict[str, Any] | None = None
    ) -> dict[str, list[int]]:
        """The versions this stage still reads by time travel, by table path, and
        ``consumed``, the input version it follows the input's added rows after."""
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
        reads = input_versions(plan["input_from"], plan["input_to"]) if plan is not None else ()
        pins[self.input_path] = [consumed, *reads]
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

    # ------------------------------------------------------------------ one step

    def step(
        self, run_id: str, take_input: bool, state: dict[str, Any] | None = None
    ) -> SsbjStepReport:
        """One Algorithm 1 iteration from ``state`` (the controller state, read afresh when
        not given); the caller records the report's metrics."""
        started = time.monotonic()
        if state is None:
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
        new_rows = self._suppressed(
            self._input_rows(plan["input_from"], plan["input_to"]),
            state,
            INTERVAL_START,
            INPUT_VERSION,
        )
        sizes = self._sizes(state, new_rows, master)
        wide = WideTable.of(self.spec, new_rows.schema, master.schema)

        late = self._late_rule(state, plan)
        reads = schedule(
            position,
            version,
            self.use_cache,
            # Late rows may return, new tuples of the step pinned to its version.
            takes_input=plan["input_to"] > plan["input_from"]
            or (late is not None and int(state.get("late_rows", 0)) > 0),
            chunk_versions=[int(v) for v in state["chunks"].values()],
            cache_version=state["cache_version"],
            switch_version=state["switch_version"],
        )
        asking = self._asking_tuples(state, plan)
        routing = self._routing(state)
        scans = self._partitions(plan, position, master, reads)
        # In the driver the master rows no tuple asks for are dropped as each file is read,
        # so only what the step keeps counts against the limit; a Spark collect ships them.
        in_driver = self._in_driver(reads, wide, routing) and self._collects(state, asking, 0)
        collects = in_driver or self._collects(
            state, asking, sum(_rows(files) for _, _, files in scans)
        )
        keyed_in_driver: pa.Table | None = None
        if in_driver:
            try:
                keyed_in_driver = self._keyed_arrow(state, plan, scans, wide, routing, report)
            except (pa.ArrowException, OSError, MemoryError) as e:
                # OSError: pyarrow's I/O errors (a transient object-store read), which a
                # Spark task would have retried.
                self._warn_runs_in_spark("reading the step's rows in the driver", e)
        if keyed_in_driver is not None:
            deltas = BucketDeltas()
        else:
            inputs, partitions, deltas = self._inputs(
                state, plan, scans, master, reads, wide, new_rows, report
            )
        stream_key, master_key = wide.plan_positions()
        report.late_waits = late is not None and late.waits
        step_plan = StepPlan(
            step=step,
            position=position,
            master_version=version,
            stream_key=stream_key,
            master_key=master_key,
            sizes=sizes,
            use_cache=self.use_cache,
            # Keeping late tuples, Algorithm 1 emits every tuple that met no row, to settle.
            left_join=self.spec.how == "left" or late is not None,
            switch_factor=self.params.switch_factor,
            estimator=self.params.scount_estimator,
            switch_version=reads.collecting,
            partition_versions=reads.partition_versions,
        )
        planned = time.monotonic()
        shape = self._sketch_shape()
        saved_sketch = self._saved_sketch(state, shape)
        tracked = self._tracked(shape, saved_sketch)
        function = wide.bucket_function(
            step_plan,
            deltas,
            routing,
            self.params.rebalance_keys,
            tracked,
            shape,
            late,
        )
        collected = None
        if keyed_in_driver is not None:
            collected = wide.step_in_driver(keyed_in_driver, function)
        else:
            # A collected step ships its whole partition: the buckets drop the rows no
            # tuple asks for (``unasked_partition_rows_dropped``) in the driver, and the
            # semi-join's shuffles would cost the collect more than the rows it saves.
            semi_join = not collects and report.master_rows_read > SEMI_JOIN_ROWS_PER_TUPLE * asking
            keyed = wide.keyed_rows(inputs, partitions, routing, semi_join)
            if collects:
                collected = self._collect(wide, keyed, function)
        if collected is not None:
            counts, loads, sketches = self._write_collected(wide, collected, routing, step, report)
        else:
            result = wide.step(keyed, function)
            counts, loads, sketches = self._run_and_write(wide, result, routing, step, report)
        written = time.monotonic()
        self._rebalance(state, routing, loads, report)
        self._count_keys(state, position, shape, saved_sketch, sketches, report)
        report.tracked_keys = len(tracked) if tracked is not None else 0

        for counted in fields(StepCounts):  # the buckets' counts, summed (MESHJOIN: no H_R)
            setattr(report, counted.name, counts[counted.name])
        report.tuples_in -= report.returned  # returning tuples are not new input
        for name in ("late_entered", "late_answered", "late_expired", "late_rows", "late_waiting"):
            setattr(report, name, counts[name])
        report.late_oldest_us = counts.get("late_oldest_us")
        report.late_min_version = counts.get("late_min_version")
        cache_version_before = state["cache_version"]
        self._complete(state, plan, position, report, master, reads)
        report.seconds = time.monotonic() - started
        completing = time.monotonic()
        self.store.complete_step(self.stage.name, plan["input_to"], step + 1, state)
        self.store.set_pins(ssbj_holder(self.stage.name), self._pins(state, int(plan["input_to"])))
        logger.debug(
            "ssbj %s step %d took %.2fs: plan and reads %.2f, the pass and both writes %.2f, "
            "then %.2f to complete the step in the state store",
            self.stage.name,
            step,
            report.seconds,
            planned - started,
            written - planned,
            time.monotonic() - completing,
        )
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

    def _inputs(
        self,
        state: dict[str, Any],
        plan: dict[str, Any],
        scans: PartitionScans,
        master: Snapshot,
        reads: Schedule,
        wide: WideTable,
        new_rows: DataFrame,
        report: SsbjStepReport,
    ) -> tuple[list[DataFrame], list[DataFrame], BucketDeltas]:
        """The step's wide inputs (new tuples, stored state, master changes) and the master
        partition rows of every version it meets (``scans``: :meth:`_partitions`)."""
        inputs = [wide.stream_rows(new_rows)]
        partitions: list[DataFrame] = []
        if STATE_TABLE in plan["tables"]:
            stored = self.engine.read(self.state_path, version=plan["tables"][STATE_TABLE])
            inputs.append(self._suppressed_pending(wide.state_rows(stored), state))
        for pinned, table, files in scans:
            rows = self.engine.read_files(table, files).select(*self.spec.master_columns)
            partitions.append(wide.partition_rows(rows, pinned))
            report.master_bytes_read += sum(f.size_bytes for f in files)
            report.master_rows_read += _rows(files)
        deltas, changed = self._deltas(reads, master, wide)
        return inputs + changed, partitions, deltas

    def _partitions(
        self, plan: dict[str, Any], position: StepPosition, master: Snapshot, reads: Schedule
    ) -> PartitionScans:
        """(pinned master version, table version, files) of the step's partition of every
        master version it meets, in version order (:meth:`_partition`), from the logs: the
        collect estimate counts their rows, and either read takes them."""
        found = []
        for pinned in sorted(reads.partition_versions):
            snapshot = (
                master
                if pinned == master.version
                else self.engine.snapshot(self.master_path, pinned)
            )
            table, files = self._partition(
                snapshot, position.partition, position.partitions, plan["scan"]
            )
            found.append((pinned, table, files))
        return found

    def _in_driver(self, reads: Schedule, wide: WideTable, routing: KeyRouting) -> bool:
        """Whether a collected step reads and lays out its rows in the driver too (no Spark
        job at all): on an engine whose reads need no Spark, with no master changes to
        apply this step, keys hashed there exactly as Spark hashes them, and no split keys
        (each ``WideTable.keyed_rows_arrow``). Any other collected step takes one Spark job."""
        return (
            self.engine.arrow_in_driver
            and self._input_rows_arrow is not None
            and reads.cache_from is None
            and reads.switch_from is None
            and not routing.split
            and wide.arrow_keys_supported()
        )

    def _keyed_arrow(
        self,
        state: dict[str, Any],
        plan: dict[str, Any],
        scans: PartitionScans,
        wide: WideTable,
        routing: KeyRouting,
        report: SsbjStepReport,
    ) -> pa.Table:
        """The step's keyed rows read and laid out in the driver (:meth:`_inputs` and
        ``WideTable.keyed_rows`` in memory): new tuples, stored state, master partitions."""
        assert self._input_rows_arrow is not None
        new = self._input_rows_arrow(plan["input_from"], plan["input_to"])
        covered = self._covered_arrow(new, state, INTERVAL_START, INPUT_VERSION)
        if covered is not None:
            new = new.filter(pc.invert(covered))
        inputs = [wide.stream_rows_arrow(new)]
        if STATE_TABLE in plan["tables"]:
            stored = self.engine.snapshot(self.state_path, plan["tables"][STATE_TABLE])
            rows = wide.state_rows_arrow(self.engine.read_arrow(stored))
            covered = self._covered_arrow(
                rows, state, stream_field(INTERVAL_START), stream_field(INPUT_VERSION)
            )
            if covered is not None:
                held = pc.and_(
                    pc.equal(rows.column(ROLE), PENDING), pc.is_null(rows.column(LATE_SINCE))
                )
                rows = rows.filter(pc.invert(pc.and_(held, covered)))
            inputs.append(rows)
        partitions = []
        read: list[DataFile] = []
        # Only the master rows a tuple asks for leave each file as it is read: a partition
        # costs the scan of its key columns, not its rows' memory.
        asked = wide.asked_keys(inputs)
        bounds = asked.bounds() if asked is not None else {}
        for pinned, table, partition in scans:
            files = [f for f in partition if _may_hold(f, bounds)]
            rows = self.engine.read_arrow(
                table,
                files,
                self.spec.master_columns,
                asked.row_filter() if asked is not None else None,
            )
            partitions.append(wide.partition_rows_arrow(rows, pinned))
            read += files
        keyed = wide.keyed_rows_arrow(inputs, partitions, routing)
        report.master_bytes_read += sum(f.size_bytes for f in read)
        report.master_rows_read += _rows(read)
        return keyed

    def _asking_tuples(self, state: dict[str, Any], plan: dict[str, Any]) -> int:
        """The tuples that probe this step's master partition: H_S after the last step, the
        late rows (any may return) and the new input's rows (from the input's commit
        files, no Spark job)."""
        new = 0
        if plan["input_to"] > plan["input_from"]:
            new = sum(
                rows
                for _, rows in self.engine.rows_by_version(
                    self.input_path, int(plan["input_from"]), int(plan["input_to"])
                )
            )
        return int(state.get("pending_rows", 0)) + int(state.get("late_rows", 0)) + new

    def _collects(self, state: dict[str, Any], asking: int, master_rows: int) -> bool:
        """Whether this step's rows and result are expected to stay under
        ``operator.collect_rows``: the state the last step left (H_S, H_R, the counters),
        the master rows it reads (the keyed rows the driver collects hold them, or the
        share a semi-join keeps) and its new and waiting tuples with room for several rows
        of matches each."""
        expected = (
            int(state.get("pending_rows", 0))
            + int(state.get("cache_rows", 0))
            + int(state.get("counter_rows", 0))
            + master_rows
            + 4 * asking
        )
        return expected < self.params.collect_rows

    def _collect(
        self,
        wide: WideTable,
        keyed: DataFrame,
        function: Callable[[pa.Table], pa.Table],
    ) -> pa.Table | None:
        """The step's result computed in the driver: its keyed rows collected as Arrow (one
        Spark job: the reads, the semi-join, the hashes and the buckets' labels), then each
        bucket through ``function`` here (``WideTable.step_in_driver``). None when the
        driver cannot take the rows (``spark.driver.maxResultSize``, say): the step then
        runs in Spark tasks instead."""
        try:
            rows = keyed.toArrow()
        except _COLLECT_ERRORS as e:
            self._warn_runs_in_spark("collecting the step's rows", e)
            return None
        return wide.step_in_driver(rows, function)

    def _warn_runs_in_spark(self, what: str, error: BaseException) -> None:
        logger.warning(
            "ssbj %s: %s failed (%s); it runs in Spark this step",
            self.stage.name,
            what,
            str(error).splitlines()[0][:300],
        )

    def _write_collected(
        self,
        wide: WideTable,
        result: pa.Table,
        routing: KeyRouting,
        step: int,
        report: SsbjStepReport,
    ) -> tuple[Counter[str], list[BucketLoad], list[ASketch]]:
        """The output and the state of a step whose result was collected, written from the
        driver (the embedded engine writes them without a Spark job)."""
        counts, loads, sketches = self._summary(summary_rows_arrow(result), routing)
        self._commit_step(
            wide,
            lambda txn: self.engine.append_arrow(
                self.output_path, wide.enriched_arrow(result), txn, (INTERVAL_START,)
            ),
            lambda txn: self.engine.overwrite_arrow(self.state_path, state_of_arrow(result), txn),
            step,
            report,
        )
        return counts, loads, sketches

    def _commit_step(
        self,
        wide: WideTable,
        append_output: Callable[[AppTransaction], CommitOutcome],
        overwrite_state: Callable[[AppTransaction], CommitOutcome],
        step: int,
        report: SsbjStepReport,
    ) -> None:
        """The step's two commits, in this order, each with the step's app transaction: a
        rerun after a crash between them skips the one that landed."""
        outcome = append_output(AppTransaction(f"stage.{self.stage.name}", step + 1))
        if outcome.committed:
            report.output_version = outcome.table_version
        crash_point("ssbj.after_output")
        self.engine.create_table(self.state_path, wide.schema)
        overwrite_state(AppTransaction(f"ssbj.{self.stage.name}.state", step))
        crash_point("ssbj.before_complete")

    @staticmethod
    def _summary(
        rows: Iterable[tuple[Any, ...]], routing: KeyRouting
    ) -> tuple[Counter[str], list[BucketLoad], list[ASketch]]:
        """The step's counts (summed over buckets), the buckets' loads and key sketches from
        its summary rows (``joins.ssbj.step.summary_of``)."""
        counts: Counter[str] = Counter()
        load_rows = []
        sketches = []
        for role, name, value, label, key_hash, stored, probes, sketch in rows:
            if role == METRIC_ROLE and name in LATE_MIN_METRICS:
                counts[name] = min(int(value), counts.get(name, int(value)))
            elif role == METRIC_ROLE:
                counts[name] += int(value)
            elif role == KEY_LOAD:
                load_rows.append((label, key_hash, stored, probes))
            elif role == KEY_SKETCH:
                sketches.append(ASketch.from_dict(json.loads(bytes(sketch))))
        return counts, bucket_loads(load_rows, routing.buckets), sketches

    def _run_and_write(
        self,
        wide: WideTable,
        step_result: DataFrame,
        routing: KeyRouting,
        step: int,
        report: SsbjStepReport,
    ) -> tuple[Counter[str], list[BucketLoad], list[ASketch]]:
        """Compute the step once, then commit its output and its state; the step's counts,
        the buckets' loads and their key sketches (none unless ``key_counts: sketch``).

        The first action (counts and loads) materialises every bucket's result; both writes
        read it back, so the data is read and joined once whatever the writes' plans."""
        result = step_result.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            counts, loads, sketches = self._summary(
                (tuple(row) for row in summary_of(result).collect()), routing
            )
            self._commit_step(
                wide,
                lambda txn: self.engine.append(
                    self.output_path, wide.enriched(result), txn, (INTERVAL_START,)
                ),
                lambda txn: self.engine.overwrite(self.state_path, state_of(result), txn),
                step,
                report,
            )
        finally:
            result.unpersist()
        return counts, loads, sketches

    def _sketch_shape(self) -> SketchShape | None:
        """The ASketch size ``key_counts: sketch`` asks for; None for exact counts."""
        if self.params.key_counts != "sketch" or not self.use_cache:
            return None
        return SketchShape(
            self.params.sketch_keys, self.params.sketch_depth, self.params.sketch_width
        )

    def _saved_sketch(self, state: dict[str, Any], shape: SketchShape | None) -> ASketch | None:
        """The key sketch saved with the last step, read once per step; None when there is
        none yet, or when the configured size changed (a new sketch starts this step)."""
        saved = state.get("key_sketch")
        if shape is None or saved is None:
            return None
        sketch = ASketch.from_dict(saved)
        if sketch.shape != shape:
            logger.info(
                "ssbj %s: the key sketch's size changed from %s to %s; a new one starts",
                self.stage.name,
                sketch.shape,
                shape,
            )
            return None
        return sketch

    @staticmethod
    def _tracked(shape: SketchShape | None, saved: ASketch | None) -> list[int] | None:
        """The key hashes this step counts: the saved sketch's filter (the most frequent
        values of the R-cycle so far, or of the last one at a cycle's first step); none
        before the first sketch. None counts every value (``key_counts: exact``)."""
        if shape is None:
            return None
        if saved is None:
            return []
        return sorted(key for key in saved.filter if isinstance(key, int))

    def _count_keys(
        self,
        state: dict[str, Any],
        position: StepPosition,
        shape: SketchShape | None,
        saved: ASketch | None,
        parts: list[ASketch],
        report: SsbjStepReport,
    ) -> None:
        """Merge the buckets' key sketches into the operator's (``saved``), saved with the
        step.

        The sketch counts the stream since the current incrementing cycle began, the
        cycle whose s_count the switching decision reads: it starts afresh at that cycle's
        first step (whose tracked values came from the cycle before)."""
        if shape is None:
            state.pop("key_sketch", None)
            return
        restart = position.starts_cycle and position.state is CycleState.INCREMENTING
        base = [] if saved is None or restart else [saved]
        merged = ASketch.merge_all(base + parts) if base or parts else shape.empty()
        state["key_sketch"] = merged.to_dict()
        report.sketch_bytes = merged.size_bytes()

    def _routing(self, state: dict[str, Any]) -> KeyRouting:
        """The step's key routing: the saved one, or every key at home when there is none
        or the bucket count changed (any routing is exact, see ``joins.ssbj.skew.key_routing``)."""
        buckets = self._buckets()
        saved = state.get("routing")
        if saved is None or self.params.rebalance == "off":
            return KeyRouting(buckets)
        routing = KeyRouting.from_dict(saved)
        if routing.buckets != buckets:
            logger.info(
                "ssbj %s: %d key buckets now (%d before): the %d moved keys go home",
                self.stage.name,
                buckets,
                routing.buckets,
                len(routing.moved),
            )
            return KeyRouting(buckets)
        return routing

    def _rebalance(
        self,
        state: dict[str, Any],
        routing: KeyRouting,
        loads: list[BucketLoad],
        report: SsbjStepReport,
    ) -> None:
        """FastJoin's monitor after the step: measure LI and, past the threshold, plan the
        moves that the next step's routing applies (saved with the completed step)."""
        method = self.params.rebalance
        if method == "off":  # LI is still measured: no threshold is ever exceeded
            report.load_imbalance = report.load_imbalance_after = rebalance(
                routing, loads, math.inf
            ).before
            state.pop("routing", None)
            return
        planned = rebalance(
            routing,
            loads,
            self.params.rebalance_threshold,
            method,
            seed=int(state["next_step"]),
            split_factor=self.params.split_hot_keys,
            split_ways=self.params.split_ways,
        )
        report.load_imbalance = planned.before
        report.load_imbalance_after = planned.after
        report.moved_keys = planned.moved_keys
        report.moved_tuples = planned.moved_tuples
        routed = routing.with_moves(
            moves_of(planned.migrations), self.params.rebalance_table
        ).with_splits(dict(planned.splits))
        report.routed_keys = len(routed.moved)
        report.split_keys = len(routed.split)
        state["routing"] = routed.to_dict()
        if planned.splits != routing.split:
            logger.info(
                "ssbj %s step %d: %d hot key(s) split over %s bucket(s) for the next step",
                self.stage.name,
                report.step,
                len(planned.splits),
                "+".join(str(1 + len(r)) for _, r in planned.splits) or "no",
            )
        if planned.migrations:
            logger.info(
                "ssbj %s step %d: LI %.2f > %.2f, %s moves %d key(s) (%d stored rows) between "
                "buckets for the next step; LI by the load model %.2f after",
                self.stage.name,
                report.step,
                planned.before,
                self.params.rebalance_threshold,
                method,
                planned.moved_keys,
                planned.moved_tuples,
                planned.after,
            )

    def _complete(
        self,
        state: dict[str, Any],
        plan: dict[str, Any],
        position: StepPosition,
        report: SsbjStepReport,
        master: Snapshot,
        reads: Schedule,
    ) -> None:
        """The controller state after the step: chunk pins, versions, counts."""
        step = plan["step"]
        version = plan["master_version"]
        chunks = dict(state["chunks"])
        chunk_rows = dict(state.get("chunk_rows", {}))
        if report.entered_pending:
            chunks[str(step)] = version
            chunk_rows[str(step)] = report.entered_pending
        expiring = step - position.partitions + 1
        for entry in [e for e in chunks if int(e) <= expiring]:
            chunks.pop(entry)
            chunk_rows.pop(entry, None)
        state["chunks"] = chunks
        state["chunk_rows"] = chunk_rows
        state["cache_version"] = version if self.use_cache else None
        state["switch_version"] = reads.next_switch_version(state["switch_version"], version)
        state["pending_rows"] = report.pending_rows
        state["cache_rows"] = report.cache_rows
        state["counter_rows"] = report.counter_rows
        state["late_rows"] = report.late_rows
        state["late_waiting"] = report.late_waiting
        state["late_oldest_us"] = report.late_oldest_us
        state["late_min_version"] = report.late_min_version
        state["next_step"] = step + 1
        state["plan"] = None
        if report.tuples_in + report.returned:
            state["miss_rate"] = report.entered_pending / (report.tuples_in + report.returned)
        sizes = self._known_sizes(state)
        if sizes is not None:  # Eq. 1's terms, from the sizes measured once per stage
            report.pending_bytes = int(report.pending_rows * sizes.stream_bytes)
            report.cache_bytes = int(report.cache_rows * sizes.master_bytes)
            report.state_bytes = OperatorMemory(
                _rows(master.files) / self.params.partitions,
                report.cache_rows,
                report.pending_rows,
            ).bytes(sizes)

    # ------------------------------------------------------------------ inputs

    def _deltas(
        self, reads: Schedule, master: Snapshot, wide: WideTable
    ) -> tuple[BucketDeltas, list[DataFrame]]:
        """How H_R (and s_B, when a phase-out moves it) reach the ``master`` version.

        From the rows the commits in between changed, when the master says (its change data
        feed, or added files only); otherwise, after an overwrite or a compaction by a
        writer without the change feed, from the rows at the new version. Tuples pinned to
        older versions are unaffected: they read those versions.
        """
        frames: list[DataFrame] = []
        reloaded = False

        def kind(base: int | None, for_switch: bool) -> str | None:
            nonlocal reloaded
            if base is None:
                return None
            try:
                changes = self.engine.changes(self.master_path, base, master.version)
            except NotAppendOnlyError as e:
                logger.info(
                    "ssbj %s: master %s changed between v%d and v%d without a change feed "
                    "(%s); reading the tracked values again at v%d",
                    self.stage.name,
                    self.master_path,
                    base,
                    master.version,
                    e,
                    master.version,
                )
                if not reloaded:
                    frames.append(wide.reload_rows(self.engine.read_files(master)))
                    reloaded = True
                return "reload"
            frames.append(wide.change_rows(changes, CHANGE_TYPE, for_switch))
            return "changes"

        cache = kind(reads.cache_from, for_switch=False)
        switch = kind(reads.switch_from, for_switch=True)
        return BucketDeltas(cache=cache, switch=switch), frames

    def _buckets(self) -> int:
        """Key buckets of a step: one per shuffle partition (``spark.sql.shuffle.partitions``)."""
        configured = self.spark.conf.get("spark.sql.shuffle.partitions")
        return max(1, int(configured or 1))

    @staticmethod
    def _covered(state: dict[str, Any], interval: str, input_version: str) -> Any:
        """Tuples whose interval a backfill has already joined and published, or None."""
        covered = None
        for backfill in state.get("backfills", []):
            term = (
                (F.col(interval) >= F.lit(backfill["start"]).cast(T.TimestampType()))
                & (F.col(interval) < F.lit(backfill["end"]).cast(T.TimestampType()))
                & (F.col(input_version) <= F.lit(backfill["input_version"]))
            )
            covered = term if covered is None else covered | term
        return covered

    def _suppressed(
        self, frame: DataFrame, state: dict[str, Any], interval: str, input_version: str
    ) -> DataFrame:
        """Drop tuples whose interval a backfill has already joined and published."""
        covered = self._covered(state, interval, input_version)
        return frame if covered is None else frame.where(~F.coalesce(covered, F.lit(False)))

    @staticmethod
    def _covered_arrow(
        rows: pa.Table, state: dict[str, Any], interval: str, input_version: str
    ) -> pa.Array | None:
        """:meth:`_covered` of rows in memory: True where a backfill already joined the
        tuple (a null interval or version is not covered), None without backfills."""
        covered = None
        for backfill in state.get("backfills", []):
            bounds = [_utc(backfill["start"]), _utc(backfill["end"])]
            times = rows.column(interval)
            term = pc.and_kleene(
                pc.and_kleene(
                    pc.greater_equal(times, pa.scalar(bounds[0], times.type)),
                    pc.less(times, pa.scalar(bounds[1], times.type)),
                ),
                pc.less_equal(rows.column(input_version), int(backfill["input_version"])),
            )
            covered = term if covered is None else pc.or_kleene(covered, term)
        return None if covered is None else pc.fill_null(covered, False)

    def _suppressed_pending(self, frame: DataFrame, state: dict[str, Any]) -> DataFrame:
        covered = self._covered(state, stream_field(INTERVAL_START), stream_field(INPUT_VERSION))
        if covered is None:
            return frame
        # Tuples waiting for late master rows are not the backfill's (it leaves them to the
        # live steps, ``SsbjDriver.backfill``): only H_S tuples that never waited are.
        held = (F.col(ROLE) == PENDING) & F.col(LATE_SINCE).isNull()
        return frame.where(~(held & F.coalesce(covered, F.lit(False))))

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
        stream_bytes = measured_row_bytes(rows.drop(INPUT_VERSION))
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

    def _partition(
        self, snapshot: Snapshot, index: int, parts: int, scan: dict[str, int]
    ) -> tuple[Snapshot, list[DataFile]]:
        """Partition ``index`` of k of a master version: the table version and the files
        that hold it (the scan copy's, or the version's own split by bytes)."""
        scan_version = scan.get(str(snapshot.version), -1)
        if scan_version >= 0:
            copy = self.engine.snapshot(self.scan_path, scan_version)
            return copy, [f for f in copy.files if f.partition_values.get(SCAN_PART) == index]
        # a version pinned before the scan copy existed: split its files by bytes
        groups = partition_by_bytes([(f.path, f.size_bytes) for f in snapshot.files], parts)
        return snapshot, [f for f in snapshot.files if f.path in set(groups[index])]


def _now_us() -> int:
    return int(datetime.now(UTC).timestamp() * 1_000_000)


def _utc(moment: str) -> datetime:
    """An ISO time as the backfill recorded it, naive ones read as UTC (Spark's session
    time zone, in which the Spark path casts them)."""
    parsed = datetime.fromisoformat(moment)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _may_hold(file: DataFile, bounds: dict[str, tuple[Any, Any] | None]) -> bool:
    """Whether ``file`` may hold a master row asked for: not when a key asked for
    nothing, or its log statistics put that key outside the asked range."""
    for column, bound in bounds.items():
        if bound is None or not file.may_hold(column, *bound):
            return False
    return True


def _rows(files: Iterable[Any]) -> int:
    return sum(f.num_records or 0 for f in files)
