"""One SSBJ step's pass over its data (seeds/ssbj_semi_stream_balanced_join.txt,
Algorithm 1, one loop iteration), and its commits (at most two).

The step's rows (``pipeline.ssbj.reading``) are laid out as one wide table, split by the
join value's hash into key buckets as the step's routing says, and each bucket runs
Algorithm 1 (``joins.ssbj.step`` -> ``joins.ssbj.buckets``). The result holds the enriched
rows, the whole new operator state and each bucket's counts and load; the output and the
state are committed from it (``pipeline.ssbj.commit``).

Where the pass runs: a step expected to stay under ``operator.collect_rows`` runs in the
driver, reading its rows there too when the engine's reads need no Spark
(:func:`runs_in_driver`), else collecting its keyed rows in one Spark job; any other step
runs in Spark tasks, its result persisted once and read by both commits. A driver that
cannot take the rows falls back to Spark tasks, with a warning.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, partial
from typing import Any

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark import StorageLevel
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from joins.columns import INTERVAL_START
from joins.skew.asketch import ASketch
from joins.skew.key_routing import BucketLoad, KeyRouting
from joins.ssbj.algorithm import Schedule, StepPlan, schedule
from joins.ssbj.bucket_decode import BucketDeltas
from joins.ssbj.bucket_encode import LATE_MIN_METRICS
from joins.ssbj.buckets import BucketStep
from joins.ssbj.cache.rcycle import StepPosition
from joins.ssbj.roles import KEY_LOAD, KEY_SKETCH, METRIC_ROLE
from joins.ssbj.segments import SEGMENT, changed_segments, prints_of, with_segments
from joins.ssbj.step import (
    bucket_loads,
    state_of,
    state_of_arrow,
    summary_of,
    summary_rows_arrow,
)
from joins.ssbj.wide_table import WideTable
from pipeline.ssbj import hot_keys, planning, reading
from pipeline.ssbj.commit import commit_step, state_segmented
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import ControllerState, SavedPlan
from pipeline.ssbj.wiring import STATE_TABLE, SsbjWiring
from warehouse.delta import AppTransaction, CommitOutcome, PartitionFilter, Snapshot

logger = logging.getLogger(__name__)

# The master partition is semi-joined to the join values the step's tuples ask for (a
# distinct and a join, one more Spark job) only when it holds more than this many rows per
# asking tuple; a smaller one goes to the buckets whole, where Arrow drops the rows no
# tuple asks for before any is decoded (measured on a 6-tuple step: the semi-join's job
# was 0.5 s of 3.7 s; at SF10 a partition of 1M rows for 80k tuples still pays for it).
SEMI_JOIN_ROWS_PER_TUPLE = 10
# What a failed collect of a step's result raises (through py4j, converted or not).
_COLLECT_ERRORS: tuple[type[Exception], ...] = (PySparkException, Py4JError, MemoryError)


@dataclass(frozen=True)
class PassResult:
    """What the step's pass leaves for completing the step."""

    counts: Counter[str]  # the buckets' counts, summed (minima for LATE_MIN_METRICS)
    reads: Schedule  # which master versions the step read, and how H_R and s_B moved
    planned: float  # time.monotonic() when the step's reads were planned
    written: float  # time.monotonic() when both commits were done


def run_pass(
    w: SsbjWiring,
    state: ControllerState,
    plan: SavedPlan,
    position: StepPosition,
    master: Snapshot,
    report: SsbjStepReport,
) -> PassResult:
    """The step's reads, its pass and both commits; then the hot keys' routing and sketch
    for the next step, into ``state``."""
    step = plan.step
    version = plan.master_version
    # The new input's DataFrame is built only when used: a step that runs in the driver
    # reads the rows as Arrow, and needs only their schema (known after the first step).
    new_rows = cache(lambda: reading.new_rows(w, state, plan))
    sizes = reading.measure_sizes(w, state, new_rows, master)
    wide = WideTable.of(w.spec, reading.new_rows_schema(w, plan, new_rows), master.schema)

    late = planning.late_rule(w, state, plan)
    reads = schedule(
        position,
        version,
        w.use_cache,
        # Late rows may return, new tuples of the step pinned to its version.
        takes_input=plan.input_to > plan.input_from
        or (late is not None and int(state.late_rows) > 0),
        chunk_versions=[int(v) for v in state.chunks.values()],
        cache_version=state.cache_version,
        switch_version=state.switch_version,
    )
    asking = reading.asking_tuples(w, state, plan)
    routing = hot_keys.step_routing(w, state)
    scans = reading.partition_scans(w, plan, position, master, reads)
    # In the driver the master rows no tuple asks for are dropped as each file is read,
    # so only what the step keeps counts against the limit; a Spark collect ships them.
    in_driver = runs_in_driver(w, reads, wide, routing) and collects(w, state, asking, 0)
    collected_step = in_driver or collects(
        w, state, asking, sum(reading.file_rows(files) for _, _, files in scans)
    )
    keyed_in_driver: pa.Table | None = None
    if in_driver:
        try:
            keyed_in_driver = reading.keyed_rows_in_driver(
                w, state, plan, scans, wide, routing, report
            )
        except (pa.ArrowException, OSError, MemoryError) as e:
            # OSError: pyarrow's I/O errors (a transient object-store read), which a
            # Spark task would have retried.
            warn_runs_in_spark(w, "reading the step's rows in the driver", e)
    if keyed_in_driver is not None:
        deltas = BucketDeltas()
    else:
        inputs, partitions, deltas = reading.spark_inputs(
            w, state, plan, scans, master, reads, wide, new_rows(), report
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
        use_cache=w.use_cache,
        # Keeping late tuples, Algorithm 1 emits every tuple that met no row, to settle.
        left_join=w.spec.how == "left" or late is not None,
        switch_factor=w.params.switch_factor,
        estimator=w.params.scount_estimator,
        switch_version=reads.collecting,
        partition_versions=reads.partition_versions,
        one_row_per_value=not state.replica_rows,
    )
    planned = time.monotonic()
    shape = hot_keys.sketch_shape(w)
    saved_sketch = hot_keys.saved_sketch(w, state, shape)
    tracked = hot_keys.tracked_keys(shape, saved_sketch)
    function = wide.bucket_function(
        step_plan,
        deltas,
        routing,
        w.params.rebalance_keys,
        tracked,
        shape,
        late,
    )
    collected = None
    if keyed_in_driver is not None:
        # Read in the driver, the partitions hold only the rows a tuple asks for.
        collected = wide.step_in_driver(keyed_in_driver, function, partitions_asked=True)
    else:
        # A collected step ships its whole partition: the buckets drop the rows no
        # tuple asks for (``unasked_partition_rows_dropped``) in the driver, and the
        # semi-join's shuffles would cost the collect more than the rows it saves.
        semi_join = (
            not collected_step and report.master_rows_read > SEMI_JOIN_ROWS_PER_TUPLE * asking
        )
        keyed = wide.keyed_rows(inputs, partitions, routing, semi_join)
        if collected_step:
            collected = collect(w, wide, keyed, function)
    if collected is not None:
        counts, loads, sketches = write_collected(w, wide, collected, routing, state, plan, report)
    else:
        result = wide.step(keyed, function)
        counts, loads, sketches = run_and_write(w, wide, result, routing, state, plan, report)
    written = time.monotonic()
    # Without split keys every value's rows met in one bucket: its counters and mark are
    # one row each in the state just written.
    state.replica_rows = bool(routing.split)
    hot_keys.rebalance_after_step(w, state, routing, loads, report)
    hot_keys.merge_sketches(state, position, shape, saved_sketch, sketches, report)
    report.tracked_keys = len(tracked) if tracked is not None else 0
    return PassResult(counts, reads, planned, written)


# ---------------------------------------------------------------------- where it runs


def runs_in_driver(w: SsbjWiring, reads: Schedule, wide: WideTable, routing: KeyRouting) -> bool:
    """Whether a collected step reads and lays out its rows in the driver too (no Spark
    job at all): on an engine whose reads need no Spark, with no master changes to
    apply this step, keys hashed there exactly as Spark hashes them, and no split keys
    (each ``WideTable.keyed_rows_arrow``). Any other collected step takes one Spark job."""
    return (
        w.engine.arrow_in_driver
        and w.input_rows_arrow is not None
        and reads.cache_from is None
        and reads.switch_from is None
        and not routing.split
        and wide.arrow_keys_supported()
    )


def collects(w: SsbjWiring, state: ControllerState, asking: int, master_rows: int) -> bool:
    """Whether this step's rows and result are expected to stay under
    ``operator.collect_rows``: the state the last step left (H_S, H_R, the counters),
    the master rows it reads (the keyed rows the driver collects hold them, or the
    share a semi-join keeps) and its new and waiting tuples with room for several rows
    of matches each."""
    expected = (
        int(state.pending_rows)
        + int(state.cache_rows)
        + int(state.counter_rows)
        + master_rows
        + 4 * asking
    )
    return expected < w.params.collect_rows


def collect(
    w: SsbjWiring,
    wide: WideTable,
    keyed: DataFrame,
    function: BucketStep,
) -> pa.Table | None:
    """The step's result computed in the driver: its keyed rows collected as Arrow (one
    Spark job: the reads, the semi-join, the hashes and the buckets' labels), then each
    bucket through ``function`` here (``WideTable.step_in_driver``). None when the
    driver cannot take the rows (``spark.driver.maxResultSize``, say): the step then
    runs in Spark tasks instead."""
    try:
        rows = keyed.toArrow()
    except _COLLECT_ERRORS as e:
        warn_runs_in_spark(w, "collecting the step's rows", e)
        return None
    return wide.step_in_driver(rows, function)


def warn_runs_in_spark(w: SsbjWiring, what: str, error: BaseException) -> None:
    logger.warning(
        "ssbj %s: %s failed (%s); it runs in Spark this step",
        w.name,
        what,
        str(error).splitlines()[0][:300],
    )


# ---------------------------------------------------------------------- results and writes


def write_collected(
    w: SsbjWiring,
    wide: WideTable,
    result: pa.Table,
    routing: KeyRouting,
    state: ControllerState,
    plan: SavedPlan,
    report: SsbjStepReport,
) -> tuple[Counter[str], list[BucketLoad], list[ASketch]]:
    """The output and the state of a step whose result was collected, written from the
    driver (the embedded engine writes them without a Spark job). A segmented state
    table gets only the segments that changed (``joins.ssbj.segments``); the new state
    is held for this process's next step (``pipeline.ssbj.warm``)."""
    counts, loads, sketches = summary(summary_rows_arrow(result), routing)
    new_state = state_of_arrow(result)
    segmented = state_segmented(w, state)
    write_state: Callable[[AppTransaction], CommitOutcome] | None
    report.state_rows_written = new_state.num_rows
    if not segmented:
        write_state = partial(w.engine.overwrite_arrow, w.state_path, new_state)
    else:
        new_state = with_segments(new_state)
        prints = prints_of(new_state)
        stored = state.segments
        if stored is None or STATE_TABLE not in plan.tables:
            write_state = partial(w.engine.overwrite_arrow, w.state_path, new_state)
        else:
            change = changed_segments(
                new_state,
                prints,
                {int(s): (int(p[0]), int(p[1])) for s, p in stored.items()},
                w.warm.held_state(w.state_path, plan.tables[STATE_TABLE]),
            )
            where = [PartitionFilter(SEGMENT, "in", list(change.segments))]
            write_state = (
                partial(w.engine.replace_arrow, w.state_path, change.rows, where)
                if change.segments
                else None
            )
            report.state_segments_written = len(change.segments)
            report.state_rows_written = change.rows.num_rows
        state.segments = {str(s): [n, m] for s, (n, m) in sorted(prints.items())}
    outcome = commit_step(
        w,
        wide,
        lambda txn: w.engine.append_arrow(
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
            state.segments = None
    return counts, loads, sketches


def run_and_write(
    w: SsbjWiring,
    wide: WideTable,
    step_result: DataFrame,
    routing: KeyRouting,
    state: ControllerState,
    plan: SavedPlan,
    report: SsbjStepReport,
) -> tuple[Counter[str], list[BucketLoad], list[ASketch]]:
    """Compute the step once, then commit its output and its state; the step's counts,
    the buckets' loads and their key sketches (none unless ``key_counts: sketch``).

    The first action (counts and loads) materialises every bucket's result; both writes
    read it back, so the data is read and joined once whatever the writes' plans. The
    state table is rewritten whole (its segments' prints would take another job)."""
    w.warm.forget_state()
    segmented = state_segmented(w, state)
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
    state.segments = None
    return counts, loads, sketches


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
