"""The SSBJ controller state: what a stage keeps in the state store between steps.

The state store holds it as one JSON object per stage (``StateStore.operator_state``);
:class:`ControllerState` is that object as a frozen value with typed fields, and
:class:`SavedPlan` its ``plan``, the step fixed before the step writes anything. The
object is parsed once, where a step reads it (:meth:`ControllerState.read`, which also
carries a state of the earlier operator-state layout forward), and a step's changes are
values: :meth:`ControllerState.after` is the state a completed step leaves, from the
step's plan and its :class:`StepOutcome`; nothing assigns to a state.

Both round-trip exactly (``common.stored_object``): a key a state of an earlier release
lacks reads as the default the controller always assumed for it, and a key this release
does not know is written back unchanged.

Plain Python (no Spark), so it is unit-tested on its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from common.errors import JoinError
from common.stored_object import Stored
from joins.ssbj.cache.inequality import TupleSizes

logger = logging.getLogger(__name__)

# What v_S and v_R are taken as before a step could measure them (no input to sample):
# a tuple and a row count as a byte each.
UNMEASURED_SIZES = TupleSizes(1.0, 1.0)

# The operator-state layout this driver writes; state without it is from a release that
# kept H_S, H_R and the counters in separate tables.
STATE_LAYOUT = 2


@dataclass(frozen=True)
class SavedPlan(Stored):
    """One step's plan, saved in the controller state before the step writes anything: a
    rerun after a crash reads exactly these versions."""

    step: int  # the step number (the output's app transaction is step + 1)
    input_from: int  # the input version consumed before the step
    input_to: int  # the input version the step consumes to
    master_version: int  # the master version the step joins at
    tables: Mapping[str, int]  # operator table -> the version the step reads (once it exists)
    scan: Mapping[str, int] = field(default_factory=dict)  # master version -> scan copy version
    # The step's time and the stage's wait: late tuples are settled by them, and a rerun of
    # the step (even after a config edit) settles them alike. None in plans of releases
    # without late rows (then no late row is settled by the plan's time).
    at_us: int | None = None
    late_wait_us: int | None = None
    backlog_rows: int = 0  # input rows left for a later step by the memory budget

    # The order a new plan's keys are written in.
    KEYS: ClassVar[tuple[str, ...]] = (
        "step",
        "at_us",
        "late_wait_us",
        "input_from",
        "input_to",
        "backlog_rows",
        "master_version",
        "tables",
    )

    @classmethod
    def new(
        cls,
        step: int,
        at_us: int,
        late_wait_us: int | None,
        input_from: int,
        input_to: int,
        backlog_rows: int,
        master_version: int,
        tables: Mapping[str, int],
    ) -> SavedPlan:
        """A plan made now, its ``scan`` versions still to be set."""
        return cls(
            step=step,
            at_us=at_us,
            late_wait_us=late_wait_us,
            input_from=input_from,
            input_to=input_to,
            backlog_rows=backlog_rows,
            master_version=master_version,
            tables=tables,
            stored_keys=cls.KEYS,
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SavedPlan:
        return cls._read(raw)


@dataclass(frozen=True)
class StepOutcome:
    """What a step's pass leaves for the controller state: the operator's sizes after it
    (as its report counts them), where H_R and s_B are now, and what the pass decided for
    the next step. :meth:`ControllerState.after` is the state it leads to."""

    partitions: int  # k of the step's R-cycle position
    entered_pending: int  # tuples that entered H_S at this step (its chunk)
    tuples_seen: int  # new and returning tuples the step took
    pending_rows: int
    cache_rows: int
    switch_rows: int
    counter_rows: int
    late_rows: int
    late_waiting: int
    late_oldest_us: int | None
    late_min_version: int | None
    cache_version: int | None  # the master version H_R is at (None: no cache)
    switch_version: int | None  # the master version s_B is at
    replica_rows: bool  # the state table may hold a value's counters more than once
    routing: Mapping[str, Any] | None  # the next step's key routing (None: none kept)
    key_sketch: Mapping[str, Any] | None  # the merged key sketch (None: none kept)
    segments: Mapping[str, Sequence[int]] | None  # the state table's segments (None: unknown)
    sizes: TupleSizes | None = None  # v_S and v_R when measured at this step


@dataclass(frozen=True)
class ControllerState(Stored):
    """Everything but the operator's tables that an SSBJ stage keeps between steps.

    The defaults are what the controller reads for a key the stored object lacks.
    """

    layout: int  # STATE_LAYOUT
    next_step: int  # the step the next step is
    cycle_base: int  # the step the R-cycle count starts at (StepPosition)
    partitions: int  # k the cycle runs with; changes only while nothing is pending
    cache_version: int | None  # the master version H_R is at (None: no cache)
    switch_version: int | None  # the master version the switching buffer s_B is at
    chunks: Mapping[str, int]  # entry step -> master version its H_S tuples are pinned to
    chunk_rows: Mapping[str, int] = field(default_factory=dict)  # entry step -> H_S tuples
    pending_rows: int = 0  # H_S after the last completed step
    cache_rows: int = 0  # H_R rows after the last completed step
    switch_rows: int = 0  # s_B's master rows after the last completed step
    # Intervals a backfill joined and published: {"start", "end" (ISO), "input_version"}.
    backfills: Sequence[Mapping[str, Any]] = field(default_factory=list)
    sizes: Mapping[str, float] | None = None  # v_S and v_R, {"stream": B, "master": B}
    plan: SavedPlan | None = None  # the planned, not yet completed step
    scan: Mapping[str, int] = field(default_factory=dict)  # master version -> scan copy version
    scan_partitions: int | None = None  # the k the scan copy's versions in ``scan`` have
    routing: Mapping[str, Any] | None = None  # KeyRouting.to_dict of the next step
    key_sketch: Mapping[str, Any] | None = None  # ASketch.to_dict (key_counts: sketch)
    counter_rows: int = 0  # join values with counters after the last completed step
    late_rows: int = 0  # tuples waiting for late master rows, as late rows
    late_waiting: int = 0  # late rows and returned tuples in H_S
    late_oldest_us: int | None = None  # when the longest-waiting of them first met no row
    late_min_version: int | None = None  # the oldest version a late row met no row at
    miss_rate: float = 1.0  # the share of tuples that entered H_S in the last step
    # What the segmented state table holds, segment -> [rows, matched]
    # (``joins.ssbj.step``); None when not known (the table is not segmented, or the
    # last step wrote it from Spark tasks), and the next step rewrites it whole.
    segments: Mapping[str, Sequence[int]] | None = None
    # The state table may hold a value's counters and s_B mark more than once, one per
    # replica of a split key (the last step had split keys), or it is not known (a state
    # of an older release): the next step merges them (``StepPlan.one_row_per_value``).
    replica_rows: bool = True
    # The first step each of the stage's latest runs took, by run id, oldest first: which
    # pending tuples a run must answer before it ends (``pipeline.freshness.due_before``).
    run_starts: Mapping[str, int] = field(default_factory=dict)

    # The keys a fresh state is written with, in order.
    KEYS: ClassVar[tuple[str, ...]] = (
        "layout",
        "next_step",
        "cycle_base",
        "partitions",
        "cache_version",
        "switch_version",
        "chunks",
        "chunk_rows",
        "pending_rows",
        "cache_rows",
        "backfills",
        "sizes",
        "plan",
    )
    # What a state of the earlier layout (H_S, H_R and the counters in separate tables)
    # passes on to the current one.
    CARRIED: ClassVar[tuple[str, ...]] = ("backfills", "sizes", "scan", "scan_partitions")

    @classmethod
    def fresh(cls, next_step: int, partitions: int) -> ControllerState:
        """The state of a stage that has taken no step yet (numbered from ``next_step``)."""
        return cls(
            layout=STATE_LAYOUT,
            next_step=next_step,
            cycle_base=next_step,
            partitions=partitions,
            cache_version=None,
            switch_version=None,
            chunks={},
            stored_keys=cls.KEYS,
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ControllerState:
        """The state of ``STATE_LAYOUT`` as the state store returned it."""
        plan = raw.get("plan")
        if plan is None:
            return cls._read(raw)
        return cls._read(raw, plan=SavedPlan.from_dict(plan))

    @classmethod
    def read(
        cls, raw: Mapping[str, Any] | None, stage: str, next_step: int, partitions: int
    ) -> ControllerState:
        """The state a stage's step starts from, parsed once: the stored one, one carried
        on from the earlier layout, or a fresh one numbered from ``next_step`` (the
        steps the stage's offset counts) with ``partitions``.

        A state of the earlier layout is carried on only when nothing waits in it and no
        step is half done: the step numbering continues (the output's app transactions
        are numbered by step), the R-cycle restarts, and backfill suppressions, the
        sizes and the scan copy are kept; the cache refills over the next cycles.
        """
        if raw is None:
            return cls.fresh(next_step=next_step, partitions=partitions)
        if raw.get("layout") == STATE_LAYOUT:
            return cls.from_dict(raw)
        if raw.get("chunks") or raw.get("plan"):
            what = (
                f"{len(raw['chunks'])} chunk(s) of tuples are still pending there"
                if raw.get("chunks")
                else f"its step {raw.get('next_step')} was interrupted"
            )
            raise JoinError(
                f"stage {stage}: its operator state is from an earlier release (separate "
                f"pending/cache tables) and {what}; run `enrich drain` with that release "
                "first (nothing is read or changed until then)"
            )
        logger.warning(
            "stage %s: operator state from an earlier release with nothing pending; "
            "continuing at step %s with a fresh cache (it refills over the next cycles)",
            stage,
            raw.get("next_step", 0),
        )
        carried = {key: raw[key] for key in cls.CARRIED if raw.get(key) is not None}
        return cls.fresh(int(raw.get("next_step", 0)), partitions).updated(**carried)

    def tuple_sizes(self) -> TupleSizes | None:
        """v_S and v_R as measured once per stage, or None before they are."""
        if self.sizes:
            return TupleSizes(self.sizes["stream"], self.sizes["master"])
        return None

    def with_sizes(self, sizes: TupleSizes) -> ControllerState:
        """This state with v_S and v_R measured."""
        return self.updated(sizes={"stream": sizes.stream_bytes, "master": sizes.master_bytes})

    def resumed_at(self, done: int) -> ControllerState:
        """This state continuing at step ``done`` when steps of another driver (an auto
        stage's plain join) took the step numbers up to it: the R-cycle shifts with it."""
        shift = done - self.next_step
        if shift <= 0 or held_back(self.to_dict()):
            return self
        return self.updated(next_step=done, cycle_base=self.cycle_base + shift)

    def repartitioned(self, partitions: int, stage: str) -> ControllerState:
        """This state with the R-cycle of ``partitions`` (k), restarting at the next step
        when k changed; refused while tuples are pending (their chunks expire by the old
        k)."""
        if self.partitions == partitions:
            return self
        if self.chunks:
            raise JoinError(
                f"stage {stage}: operator.partitions changed from {self.partitions} to "
                f"{partitions} while tuples are pending; run `enrich drain` first"
            )
        return self.updated(partitions=partitions, cycle_base=self.next_step)

    def with_run_start(self, run_id: str, kept: int) -> ControllerState:
        """This state remembering that run ``run_id`` starts at the next step, keeping the
        ``kept`` latest runs; a retry of the run keeps its first record."""
        if run_id in self.run_starts:
            return self
        starts = [*self.run_starts.items(), (run_id, self.next_step)][-kept:]
        return self.updated(run_starts=dict(starts))

    def with_backfill(self, start: str, end: str, input_version: int) -> ControllerState:
        """This state with a backfill of [start, end) recorded (ISO times): later live
        steps suppress what it joined."""
        entry = {"start": start, "end": end, "input_version": input_version}
        return self.updated(backfills=[*self.backfills, entry])

    def planned(self, plan: SavedPlan, scan_partitions: int) -> ControllerState:
        """This state with ``plan`` open, its scan copy's versions (of k
        ``scan_partitions``) kept for the steps after."""
        return self.updated(scan=plan.scan, scan_partitions=scan_partitions, plan=plan)

    def after(self, plan: SavedPlan, outcome: StepOutcome) -> ControllerState:
        """The state the step of ``plan`` leaves (Algorithm 1, end of an iteration): its
        chunk enters H_S pinned to the plan's master version, the chunk of step
        ``step - k + 1`` expires, the next step is ``step + 1`` and no plan is open.

        Invariant: every chunk left was entered in the last k steps, so H_S holds at
        most k chunks (the R-cycle of ``joins.ssbj.cache.rcycle``).
        """
        step, version = plan.step, plan.master_version
        chunks = dict(self.chunks)
        chunk_rows = dict(self.chunk_rows)
        if outcome.entered_pending:
            chunks[str(step)] = version
            chunk_rows[str(step)] = outcome.entered_pending
        expiring = step - outcome.partitions + 1
        for entry in [e for e in chunks if int(e) <= expiring]:
            chunks.pop(entry)
            chunk_rows.pop(entry, None)
        state = self if outcome.sizes is None else self.with_sizes(outcome.sizes)
        if outcome.segments != state.segments:
            state = state.updated(segments=outcome.segments)
        state = state.updated(replica_rows=outcome.replica_rows)
        for name in ("routing", "key_sketch"):
            value = getattr(outcome, name)
            state = state.without(name) if value is None else state.updated(**{name: value})
        state = state.updated(
            chunks=chunks,
            chunk_rows=chunk_rows,
            cache_version=outcome.cache_version,
            switch_version=outcome.switch_version,
            pending_rows=outcome.pending_rows,
            cache_rows=outcome.cache_rows,
            switch_rows=outcome.switch_rows,
            counter_rows=outcome.counter_rows,
            late_rows=outcome.late_rows,
            late_waiting=outcome.late_waiting,
            late_oldest_us=outcome.late_oldest_us,
            late_min_version=outcome.late_min_version,
            next_step=step + 1,
            plan=None,
        )
        if outcome.tuples_seen:
            state = state.updated(miss_rate=outcome.entered_pending / outcome.tuples_seen)
        return state


def held_back(state: Mapping[str, Any] | None) -> str | None:
    """What the controller ``state`` (as stored, of any release) still holds that a later
    step must finish, or None: tuples waiting in H_S (their chunks), a step that was
    planned and not completed, or tuples waiting for late master rows.

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
