"""Planning an SSBJ step: the controller state it starts from, its place in the R-cycle,
and its plan, saved before the step writes anything.

The plan fixes the input range, the master version, the versions of the operator's tables
and the scan copy, the step's time and the stage's wait for late master rows. Version pins
(``pipeline.ssbj.commit.pins``) are set in the transaction that saves the plan, and a rerun
after a crash anywhere reads exactly the plan's versions. Under ``operator.memory_bytes``
the plan admits only the input versions whose tuples fit the budget (Eq. 1,
``joins.ssbj.cache.intake``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from common.errors import ConfigError
from joins.ssbj.cache.intake import Admission, OperatorMemory, admit, chunk_capacity
from joins.ssbj.cache.rcycle import StepPosition
from joins.ssbj.late import LateRule
from pipeline.pins import PinHolder
from pipeline.ssbj.commit import pins
from pipeline.ssbj.placement import measure_sizes
from pipeline.ssbj.scan_copy import scan_versions
from pipeline.ssbj.state import UNMEASURED_SIZES, ControllerState, SavedPlan
from pipeline.ssbj.wiring import SsbjWiring
from warehouse.delta import Snapshot
from warehouse.delta.api import records_in
from warehouse.state_tables import StageOffset

logger = logging.getLogger(__name__)

ADMISSION_HORIZON_VERSIONS = 256


def now_us() -> int:
    return int(datetime.now(UTC).timestamp() * 1_000_000)


# ---------------------------------------------------------------------- the state


@dataclass(frozen=True)
class Progress:
    """What a step starts from: the controller state and the stage's offset, read in one
    transaction (the offset tells the input consumed and the steps completed)."""

    state: ControllerState
    offset: StageOffset


def load_state(w: SsbjWiring) -> ControllerState:
    """The controller state a step starts from (see :func:`load`)."""
    return load(w).state


def load(w: SsbjWiring) -> Progress:
    """The controller state a step starts from (the saved one, carried on from an earlier
    release's, or a fresh one) and the stage's offset.

    The output's app transactions are numbered by step, and steps of another driver (an
    auto stage that ran the plain join meanwhile) advanced the offset's step count: SSBJ
    continues above it, or its next commit would be skipped as done.
    """
    offset, raw = w.store.stage_progress(w.name)
    done = offset.step_seq
    read = ControllerState.read(raw, w.name, next_step=done, partitions=w.params.partitions)
    state = read.resumed_at(done)
    if state is not read:
        logger.info(
            "stage %s: SSBJ resumes at step %d after %d step(s) of the plain join",
            w.name,
            done,
            done - read.next_step,
        )
    return Progress(state, offset)


# ---------------------------------------------------------------------- idle


def idle(
    w: SsbjWiring, take_input: bool, state: ControllerState, offset: StageOffset | None = None
) -> bool:
    """True when a step from ``state`` would have nothing to do: no tuple waits in H_S, no
    step is half done and (if the step would take input) no input version is new.
    ``offset``: the stage's, when read with the state (else it is read here)."""
    if state.chunks or state.plan or late_rows_due(w, state):
        return False
    if not take_input:
        return True
    return not input_waiting(w, w.store.offset(w.name) if offset is None else offset)


def input_waiting(w: SsbjWiring, offset: StageOffset) -> bool:
    """True when the input table has versions the stage has not taken (a memory budget
    left them, or they arrived since)."""
    if not w.engine.exists(w.input_path):
        return False
    return w.engine.snapshot(w.input_path).version > offset.input_version


def late_rows_due(w: SsbjWiring, state: ControllerState) -> bool:
    """Whether a late row would return (the master has a version newer than one a late
    row met no row at) or expire (the longest wait is over) at a step now."""
    if not int(state.late_rows):
        return False
    oldest, version = state.late_oldest_us, state.late_min_version
    if version is None or oldest is None:
        return True
    if w.engine.snapshot(w.master_path).version > int(version):
        return True
    return int(oldest) <= now_us() - wait_us(w)


def wait_us(w: SsbjWiring) -> int:
    late = w.params.late_master
    return int(late.wait_delta.total_seconds() * 1_000_000) if late is not None else 0


def late_rule(w: SsbjWiring, state: ControllerState, plan: SavedPlan) -> LateRule | None:
    """How the step settles tuples no master row answered, when the stage keeps them
    waiting or late rows are left from when it did (``joins.ssbj.late``), by the
    plan's time and wait (``None``: no ``late_master``, every waiting tuple expires)."""
    wait = plan.late_wait_us
    if wait is None and not int(state.late_rows):
        return None
    return LateRule(
        # A plan saved by a release without late rows has no time: none are settled.
        at_us=int(plan.at_us or now_us()),
        wait_us=int(wait or 0),
        left_join=w.spec.how == "left",
        master_version=int(plan.master_version),
    )


# ---------------------------------------------------------------------- the plan


def position(w: SsbjWiring, state: ControllerState) -> StepPosition:
    """The place in the R-cycle of the step ``state`` is at (its k: see
    :meth:`ControllerState.repartitioned`)."""
    return StepPosition(
        state.next_step - state.cycle_base,
        state.partitions,
        w.params.eviction_cycles,
    )


@dataclass(frozen=True)
class Planned:
    """A step's planned state (:func:`plan_step`), and the seconds planning spent
    creating the scan copy (``pipeline.ssbj.scan_copy.ScanVersions``)."""

    state: ControllerState
    scan_created_seconds: float = 0.0


def plan_step(
    w: SsbjWiring, state: ControllerState, take_input: bool, offset: StageOffset
) -> Planned:
    """``state`` with the plan of the step it is at: the saved one when a rerun finds it,
    else a new one, saved (after its pins) before it is returned. ``offset``: the
    stage's, read with the state (:func:`load`)."""
    step = state.next_step
    plan = state.plan
    if plan is not None and plan.step == step:
        return Planned(state)
    input_to = offset.input_version
    if take_input and w.engine.exists(w.input_path):
        input_to = w.engine.snapshot(w.input_path).version
    master = w.engine.snapshot(w.master_path)
    backlog = 0
    if w.params.memory_bytes is not None and input_to > offset.input_version:
        if state.tuple_sizes() is None:  # the first step: sample the next input
            horizon = min(input_to, offset.input_version + 8)
            measured = measure_sizes(
                w, lambda: w.new_rows(offset.input_version, horizon).to_spark(), master
            )
            state = state if measured is None else state.with_sizes(measured)
        admission = admit_input(w, state, offset.input_version, input_to, master)
        input_to, backlog = admission.to_version, admission.backlog_rows
    plan = SavedPlan.new(
        step=step,
        # The step's time and the stage's wait: late tuples are settled by them, and a
        # rerun of the step (even after a config edit) settles them alike.
        at_us=now_us(),
        late_wait_us=wait_us(w) if w.params.late_master is not None else None,
        input_from=offset.input_version,
        input_to=input_to,
        backlog_rows=backlog,
        master_version=master.version,
        tables={t: w.engine.snapshot(p).version for t, p in w.tables.items() if w.engine.exists(p)},
    )
    needed = {int(v) for v in state.chunks.values()} | {master.version}
    if state.switch_version is not None:
        needed.add(int(state.switch_version))
    scan = scan_versions(w, state.scan, state.scan_partitions, master, needed)
    state = state.planned(plan.updated(scan=scan.versions), w.params.partitions)
    # The plan is saved with the pins of what it reads, in one transaction.
    planned = pins(w, state, int(plan.input_from), state.plan)
    w.store.save_operator_state(w.name, state.to_dict(), pins=(PinHolder.SSBJ.of(w.name), planned))
    return Planned(state, scan.created_seconds)


def admit_input(
    w: SsbjWiring, state: ControllerState, offset: int, latest: int, master: Snapshot
) -> Admission:
    """The input versions this step takes under ``operator.memory_bytes`` (Eq. 1)."""
    budget = w.params.memory_bytes
    assert budget is not None
    step = state.next_step
    # Look a bounded number of versions ahead: each costs a log read, and a step rarely
    # has room for more (a longer backlog is admitted over the following steps).
    horizon = min(latest, offset + ADMISSION_HORIZON_VERSIONS)
    sizes = state.tuple_sizes() or UNMEASURED_SIZES
    k = w.params.partitions
    # The chunk that expires at the end of this step leaves room for this step's chunk.
    expiring = int(state.chunk_rows.get(str(step - k + 1), 0))
    memory = OperatorMemory(
        disk_buffer_rows=records_in(master.files) / k,
        cache_rows=int(state.cache_rows) if w.use_cache else 0,
        pending_rows=max(0, int(state.pending_rows) - expiring),
        switch_rows=int(state.switch_rows) if w.use_cache else 0,
    )
    disk_buffer = memory.disk_buffer_rows * sizes.master_bytes
    if disk_buffer > budget:
        raise ConfigError(
            f"stages[{w.name}].operator.memory_bytes: {budget} bytes cannot hold "
            f"even the disk buffer, one master partition of {memory.disk_buffer_rows:.0f} "
            f"rows x {sizes.master_bytes:.0f} B = {disk_buffer:.0f} bytes; raise "
            "memory_bytes or operator.partitions"
        )
    capacity = chunk_capacity(budget, memory, sizes, k)
    miss_rate = float(state.miss_rate) if w.use_cache else 1.0
    admission = admit(
        offset,
        w.engine.rows_by_version(w.input_path, offset, horizon),
        capacity,
        miss_rate,
        nothing_pending=memory.pending_rows == 0,
    )
    log = logger.warning if admission.forced else logger.info
    log(
        "ssbj %s step %d: memory %d B holds %d new H_S tuples beside b=%.0f, H_R=%d, "
        "s_B=%d, H_S=%d rows; admitting input v%d..v%d (%d rows, miss rate %.2f%s), "
        "%d rows wait",
        w.name,
        step,
        budget,
        capacity,
        memory.disk_buffer_rows,
        memory.cache_rows,
        memory.switch_rows,
        memory.pending_rows,
        offset + 1,
        admission.to_version,
        admission.admitted_rows,
        miss_rate,
        ", one version beyond the budget so the stage progresses" if admission.forced else "",
        admission.backlog_rows,
    )
    return admission
