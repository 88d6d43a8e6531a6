"""Committing an SSBJ step, exactly once: its Delta commits (the output, then the state
segments that changed, if any), the controller state after
it, and the version pins that keep what a step reads from vacuum.

Both commits carry the step's app transaction, output first, then the operator state; the
step is then completed in one state-store transaction (offset, step count and controller
state together). A rerun after a crash anywhere recomputes the same result from the plan's
versions and skips the commits that landed.

Version pins (holder ``ssbj.<stage>``, see :mod:`pipeline.pins`): the master versions that
pending chunks are pinned to and that the cache and the switching buffer are at; while a
step's plan is open also the plan's master version, the master versions whose changes bring
the cache and the buffer to it, the state table's version and the input versions. The pins
are set in the transaction that saves the plan (``pipeline.ssbj.planning``) and replaced by
the completed state's pins in the one that completes the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from pyspark.sql.types import LongType, StructField, StructType

from common.faults import crash_point
from joins.ssbj.cache.intake import OperatorMemory
from joins.ssbj.segments import SEGMENT
from joins.ssbj.wide_table import WideTable
from pipeline.pins import PinHolder, input_versions, union_pins
from pipeline.ssbj.reading import file_rows
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import ControllerState, SavedPlan, StepOutcome
from pipeline.ssbj.wiring import SsbjWiring
from warehouse.delta import AppTransaction, CommitOutcome, Snapshot
from warehouse.state_metrics import StepMetricValues


def commit_step(
    w: SsbjWiring,
    wide: WideTable,
    append_output: Callable[[AppTransaction], CommitOutcome],
    write_state: Callable[[AppTransaction], CommitOutcome] | None,
    step: int,
    report: SsbjStepReport,
    segmented: bool,
    state_exists: bool,
) -> CommitOutcome | None:
    """The step's commits, in this order, each with the step's app transaction: a rerun
    after a crash between them skips the one that landed. ``write_state`` None: the
    state table holds the new state already (no segment changed), and is not written.
    Returns the state commit's outcome."""
    outcome = append_output(AppTransaction(f"stage.{w.name}", step + 1))
    if outcome.committed:
        report.output_version = outcome.table_version
    crash_point("ssbj.after_output")
    if not state_exists:  # the plan read no state table: the first step creates it
        if segmented:
            w.engine.create_table(w.state_path, segmented_schema(wide), (SEGMENT,))
        else:
            w.engine.create_table(w.state_path, wide.schema)
    written = None
    if write_state is not None:
        written = write_state(AppTransaction(f"ssbj.{w.name}.state", step))
    crash_point("ssbj.before_complete")
    return written


def segmented_schema(wide: WideTable) -> StructType:
    """The state table's schema when it is segmented (``joins.ssbj.segments``)."""
    return StructType([*wide.schema.fields, StructField(SEGMENT, LongType(), True)])


def state_segmented(w: SsbjWiring, segments: Mapping[str, Sequence[int]] | None) -> bool:
    """Whether the state table is segmented (``segments``: what the controller state
    says it holds), or, not created yet, will be: a table an earlier release created
    whole stays whole (its steps rewrite it in full)."""
    if segments is not None or not w.engine.exists(w.state_path):
        return True
    return SEGMENT in w.engine.snapshot(w.state_path).partition_columns


def complete(
    w: SsbjWiring,
    state: ControllerState,
    plan: SavedPlan,
    outcome: StepOutcome,
    report: SsbjStepReport,
    master: Snapshot,
) -> ControllerState:
    """The controller state after the step (:meth:`ControllerState.after`), and Eq. 1's
    terms in ``report`` from the sizes measured once per stage."""
    after = state.after(plan, outcome)
    sizes = after.tuple_sizes()
    if sizes is not None:
        report.pending_bytes = int(report.pending_rows * sizes.stream_bytes)
        report.cache_bytes = int(report.cache_rows * sizes.master_bytes)
        report.state_bytes = OperatorMemory(
            file_rows(master.files) / w.params.partitions,
            report.cache_rows,
            report.pending_rows,
            report.switch_rows,
        ).bytes(sizes)
    return after


def finish(
    w: SsbjWiring,
    state: ControllerState,
    plan: SavedPlan,
    metrics: StepMetricValues | None = None,
) -> None:
    """Complete the step in the state store: offset, step count, controller state, the
    completed state's pins (replacing the plan's) and the step's ``metrics`` in one
    transaction."""
    completed = pins(w, state, int(plan.input_to))
    w.store.complete_step(
        w.name,
        plan.input_to,
        plan.step + 1,
        state.to_dict(),
        pins=(PinHolder.SSBJ.of(w.name), completed),
        metrics=metrics,
    )


def pins(
    w: SsbjWiring, state: ControllerState, consumed: int, plan: SavedPlan | None = None
) -> dict[str, list[int]]:
    """The versions this stage still reads by time travel, by table path, and
    ``consumed``, the input version it follows the input's added rows after."""
    master = {int(v) for v in state.chunks.values()}
    bases = [int(v) for v in (state.cache_version, state.switch_version) if v is not None]
    master.update(bases)
    found: dict[str, Iterable[int]] = {}
    if plan is not None:
        planned = int(plan.master_version)
        master.add(planned)
        for base in bases:  # the changes that bring the cache / the buffer to the plan
            master.update(range(base, planned + 1))
        found.update({w.tables[t]: [int(v)] for t, v in plan.tables.items()})
    reads = input_versions(plan.input_from, plan.input_to) if plan is not None else ()
    found[w.input_path] = [consumed, *reads]
    found[w.master_path] = master
    # The scan copy is read for the chunks' versions, the switching buffer's and the
    # plan's (the cache follows the master's own changes, not the copy).
    scanned = {int(v) for v in state.chunks.values()}
    scanned.update(int(v) for v in (state.switch_version,) if v is not None)
    if plan is not None:
        scanned.add(int(plan.master_version))
    mapping = {int(v): int(t) for v, t in state.scan.items()}
    scan = sorted({mapping[v] for v in scanned if mapping.get(v, -1) >= 0})
    if scan:
        found[w.scan_path] = scan
    return union_pins(found)
