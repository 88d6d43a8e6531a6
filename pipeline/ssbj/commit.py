"""Committing an SSBJ step, exactly once: its pass's output and new operator state (written
from the driver when the pass's result is there, :func:`write_collected`, or from Spark
when the buckets ran in Spark tasks, :func:`run_and_write`), the controller state after
it, and the version pins that keep what a step reads from vacuum.

Both commits carry the step's app transaction, output first, then the operator state (the
segments that changed, if any; :func:`commit_step`); the step is then completed in one
state-store transaction (offset, step count and controller state together). A rerun after
a crash anywhere recomputes the same result from the plan's versions and skips the commits
that landed.

Version pins (holder ``ssbj.<stage>``, see :mod:`pipeline.pins`): the master versions that
pending chunks are pinned to and that the cache and the switching buffer are at; while a
step's plan is open also the plan's master version, the master versions whose changes bring
the cache and the buffer to it, the state table's version and the input versions. The pins
are set in the transaction that saves the plan (``pipeline.ssbj.planning``) and replaced by
the completed state's pins in the one that completes the step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql.types import LongType, StructField, StructType

from common.faults import crash_point
from joins.columns import INTERVAL_START
from joins.skew.key_routing import KeyRouting
from joins.ssbj.cache.intake import OperatorMemory
from joins.ssbj.step import (
    SEGMENT,
    StepSummary,
    changed_segments,
    prints_of,
    split_collected,
    state_of,
    summary_of,
)
from joins.ssbj.wide_table import WideTable
from pipeline.pins import PinHolder, input_versions, union_pins
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import ControllerState, SavedPlan, StepOutcome
from pipeline.ssbj.wiring import STATE_TABLE, SsbjWiring
from warehouse.delta import AppTransaction, CommitOutcome, PartitionFilter, Snapshot
from warehouse.delta.api import records_in
from warehouse.state_metrics import StepMetricValues


@dataclass(frozen=True)
class PassOutcome:
    """What a step's pass and commits leave: its decoded summary (counts, the buckets'
    loads and key sketches), and the state table's segments after the commit
    (None: not known, the next step rewrites the table whole)."""

    summary: StepSummary
    segments: Mapping[str, Sequence[int]] | None  # segment -> [rows, matched]


def write_collected(
    w: SsbjWiring,
    wide: WideTable,
    result: pa.Table,
    routing: KeyRouting,
    stored: Mapping[str, Sequence[int]] | None,
    plan: SavedPlan,
    report: SsbjStepReport,
) -> PassOutcome:
    """The output and the state of a step whose result was collected, written from the
    driver (the embedded engine writes them without a Spark job). A segmented state
    table gets only the segments that changed (``joins.ssbj.step``) from the
    ``stored`` ones (the controller state's); the new state is held for this process's
    next step (``pipeline.ssbj.warm``)."""
    segmented = state_segmented(w, stored)
    collected = split_collected(result, routing.buckets, segmented)
    new_state = collected.state
    segments = stored  # unchanged unless the table is segmented
    write_state: Callable[[AppTransaction], CommitOutcome] | None
    report.state_rows_written = new_state.num_rows
    if not segmented:
        write_state = partial(w.engine.overwrite, w.state_path, new_state)
    else:
        prints = prints_of(new_state)
        if stored is None or STATE_TABLE not in plan.tables:
            write_state = partial(w.engine.overwrite, w.state_path, new_state)
        else:
            change = changed_segments(
                new_state,
                prints,
                {int(s): (int(p[0]), int(p[1])) for s, p in stored.items()},
                w.warm.held_state(w.state_path, plan.tables[STATE_TABLE]),
            )
            where = [PartitionFilter(SEGMENT, "in", list(change.segments))]
            write_state = (
                partial(w.engine.replace, w.state_path, change.rows, where)
                if change.segments
                else None
            )
            report.state_segments_written = len(change.segments)
            report.state_rows_written = change.rows.num_rows
        segments = {str(s): [n, m] for s, (n, m) in sorted(prints.items())}
    outcome = commit_step(
        w,
        wide,
        lambda txn: w.engine.append(
            w.output_path, wide.enriched_arrow(result), txn, (INTERVAL_START,)
        ),
        write_state,
        plan.step,
        report,
        segmented,
        STATE_TABLE in plan.tables,
    )
    if outcome is None:  # nothing changed: the version the step read holds the new state
        w.warm.hold_state(w.state_path, plan.tables.get(STATE_TABLE), new_state)
    elif outcome.committed:
        w.warm.hold_state(w.state_path, outcome.table_version, new_state)
    else:
        # An earlier attempt of this step landed the state: what it wrote may differ from
        # this attempt's (a backfill in between suppressed tuples), so the segments it left
        # are not known here, and the next step rewrites the table whole.
        w.warm.forget_state()
        report.state_rows_written = report.state_segments_written = 0
        if segmented:
            segments = None
    return PassOutcome(collected.summary, segments)


def run_and_write(
    w: SsbjWiring,
    wide: WideTable,
    step_result: DataFrame,
    routing: KeyRouting,
    stored: Mapping[str, Sequence[int]] | None,
    plan: SavedPlan,
    report: SsbjStepReport,
) -> PassOutcome:
    """Compute the step once, then commit its output and its state; the step's counts,
    the buckets' loads and their key sketches (none unless ``key_counts: sketch``).

    The first action (counts and loads) materialises every bucket's result; both writes
    read it back, so the data is read and joined once whatever the writes' plans. The
    state table is rewritten whole (its segments' prints would take another job)."""
    w.warm.forget_state()
    segmented = state_segmented(w, stored)
    result = step_result.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        summary = StepSummary.of_rows(
            (tuple(row) for row in summary_of(result).collect()), routing.buckets
        )
        commit_step(
            w,
            wide,
            lambda txn: w.engine.append(
                w.output_path, wide.enriched(result), txn, (INTERVAL_START,)
            ),
            lambda txn: w.engine.overwrite(w.state_path, state_of(result, segmented), txn),
            plan.step,
            report,
            segmented,
            STATE_TABLE in plan.tables,
        )
    finally:
        result.unpersist()
    return PassOutcome(summary, None)


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
    """The state table's schema when it is segmented (``joins.ssbj.step``)."""
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
            records_in(master.files) / w.params.partitions,
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
