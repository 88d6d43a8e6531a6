"""The commits of an SSBJ step's pass: its output and its new operator state, written
from the driver when the pass's result is there (:func:`write_collected`), or from Spark
when the buckets ran in Spark tasks (:func:`run_and_write`); and the step's counts, loads
and key sketches from the result's summary rows (:func:`summary`).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame

from joins.columns import INTERVAL_START
from joins.skew.asketch import ASketch
from joins.skew.key_routing import BucketLoad, KeyRouting
from joins.ssbj.bucket_encode import LATE_MIN_METRICS
from joins.ssbj.roles import KEY_LOAD, KEY_SKETCH, METRIC_ROLE
from joins.ssbj.segments import SEGMENT, changed_segments, prints_of, with_segments
from joins.ssbj.step import bucket_loads, state_of, state_of_arrow, summary_of, summary_rows_arrow
from joins.ssbj.wide_table import WideTable
from pipeline.ssbj.commit import commit_step, state_segmented
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import SavedPlan
from pipeline.ssbj.wiring import STATE_TABLE, SsbjWiring
from warehouse.delta import AppTransaction, CommitOutcome, PartitionFilter


@dataclass(frozen=True)
class PassOutcome:
    """What a step's pass and commits leave: the counts (summed over buckets), the
    buckets' loads and key sketches, and the state table's segments after the commit
    (None: not known, the next step rewrites the table whole)."""

    counts: Counter[str]
    loads: list[BucketLoad]
    sketches: list[ASketch]
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
    table gets only the segments that changed (``joins.ssbj.segments``) from the
    ``stored`` ones (the controller state's); the new state is held for this process's
    next step (``pipeline.ssbj.warm``)."""
    counts, loads, sketches = summary(summary_rows_arrow(result), routing)
    new_state = state_of_arrow(result)
    segmented = state_segmented(w, stored)
    segments = stored  # unchanged unless the table is segmented
    write_state: Callable[[AppTransaction], CommitOutcome] | None
    report.state_rows_written = new_state.num_rows
    if not segmented:
        write_state = partial(w.engine.overwrite, w.state_path, new_state)
    else:
        new_state = with_segments(new_state)
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
    return PassOutcome(counts, loads, sketches, segments)


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
        counts, loads, sketches = summary(
            (tuple(row) for row in summary_of(result).collect()), routing
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
    return PassOutcome(counts, loads, sketches, None)


def summary(
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
