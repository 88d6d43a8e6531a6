"""Where an SSBJ step's pass runs, decided once per step (:func:`place`), and the pass of
each place (:func:`open_pass`).

- ``driver``: a step expected to stay under ``operator.collect_rows`` whose rows the engine
  reads without Spark (:func:`reads_in_driver`): read by pyarrow, laid out, run through
  the buckets and written from the driver; no Spark job;
- ``collect``: any other step expected to stay under ``collect_rows``: its keyed rows built
  by Spark and collected as Arrow in one job, the buckets run in the driver;
- ``tasks``: the rest: the buckets run in Spark tasks, the result persisted once and read
  by both commits.

A place that cannot take the step hands it on, with a warning: a driver read that fails
(an Arrow, memory or I/O error) collects instead, a collect that fails (over
``spark.driver.maxResultSize``, say) runs in tasks. Nothing is written before a pass
runs, so a hand-over writes nothing twice. ``step_pass`` asks for the pass once and does
not branch on where it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from joins.skew.key_routing import KeyRouting
from joins.ssbj.algorithm import Schedule
from joins.ssbj.bucket_decode import BucketDeltas
from joins.ssbj.buckets import BucketStep
from joins.ssbj.wide_table import WideTable
from pipeline.ssbj import reading
from pipeline.ssbj.commit import PassOutcome, run_and_write, write_collected
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import ControllerState, SavedPlan
from pipeline.ssbj.wiring import SsbjWiring
from warehouse.delta import Snapshot

logger = logging.getLogger(__name__)

# In Spark tasks the master partition is semi-joined to the join values the step's tuples
# ask for (a distinct and a join, one more Spark job) only when it holds more than this
# many rows per asking tuple; a smaller one goes to the buckets whole, where Arrow drops
# the rows no tuple asks for before any is decoded (measured on a 6-tuple step: the
# semi-join's job was 0.5 s of 3.7 s; at SF10 a partition of 1M rows for 80k tuples still
# pays for it).
SEMI_JOIN_ROWS_PER_TUPLE = 10
# What a failed collect of a step's rows raises (through py4j, converted or not).
_COLLECT_ERRORS: tuple[type[Exception], ...] = (PySparkException, Py4JError, MemoryError)
# What a failed read of a step's rows in the driver raises; OSError: pyarrow's I/O errors
# (a transient object-store read), which a Spark task would have retried.
_DRIVER_READ_ERRORS: tuple[type[Exception], ...] = (pa.ArrowException, OSError, MemoryError)


class Where(Enum):
    """Where a step's pass runs (module docstring)."""

    DRIVER = "driver"
    COLLECT = "collect"
    TASKS = "tasks"


def place(
    w: SsbjWiring,
    state: ControllerState,
    reads: Schedule,
    wide: WideTable,
    routing: KeyRouting,
    asking: int,
    scans: reading.PartitionScans,
) -> Where:
    """Where the step runs, from its expected size and the features it uses. In the
    driver the master rows no tuple asks for are dropped as each file is read, so only
    what the step keeps counts against ``collect_rows``; a collect ships them all."""
    if reads_in_driver(w, reads, wide, routing) and collects(w, state, asking, 0):
        return Where.DRIVER
    if collects(w, state, asking, sum(reading.file_rows(files) for _, _, files in scans)):
        return Where.COLLECT
    return Where.TASKS


def reads_in_driver(w: SsbjWiring, reads: Schedule, wide: WideTable, routing: KeyRouting) -> bool:
    """Whether the step's rows can be read and laid out in the driver: on an engine whose
    reads need no Spark, with no master changes to apply this step, keys hashed there
    exactly as Spark hashes them, and no split keys (``WideTable.keyed_rows_arrow``)."""
    return (
        w.engine.arrow_in_driver
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


@dataclass(frozen=True)
class StepContext:
    """What every place's pass reads and writes through."""

    w: SsbjWiring
    state: ControllerState
    plan: SavedPlan
    wide: WideTable
    routing: KeyRouting
    report: SsbjStepReport


@dataclass(frozen=True)
class StepPass:
    """A step's rows, ready where they will run: ``deltas`` are the master changes the
    buckets apply (none in the driver, which reads no changes), ``run`` takes the
    buckets' function, runs it over the rows and commits the step."""

    deltas: BucketDeltas
    run: Callable[[BucketStep], PassOutcome]


def open_pass(
    where: Where,
    step: StepContext,
    scans: reading.PartitionScans,
    master: Snapshot,
    reads: Schedule,
    new_rows: Callable[[], DataFrame],
    asking: int,
) -> StepPass:
    """The step's rows read for ``where``, or for the next place when the driver cannot
    read them."""
    w, state, plan, wide, routing, report = (
        step.w,
        step.state,
        step.plan,
        step.wide,
        step.routing,
        step.report,
    )
    if where is Where.DRIVER:
        try:
            keyed_rows = reading.keyed_rows_in_driver(w, state, plan, scans, wide, routing, report)
        except _DRIVER_READ_ERRORS as e:
            _warn_hands_on(w, "reading the step's rows in the driver", e)
            where = Where.COLLECT
        else:
            # Read in the driver, the partitions hold only the rows a tuple asks for.
            return StepPass(
                BucketDeltas(),
                lambda function: _write_in_driver(
                    step, wide.step_in_driver(keyed_rows, function, partitions_asked=True)
                ),
            )
    inputs, partitions, deltas = reading.spark_inputs(
        w, state, plan, scans, master, reads, wide, new_rows(), report
    )
    # A collected step ships its whole partition: the buckets drop the rows no tuple asks
    # for (``unasked_partition_rows_dropped``) in the driver, and the semi-join's shuffles
    # would cost the collect more than the rows it saves.
    semi_join = where is Where.TASKS and report.master_rows_read > SEMI_JOIN_ROWS_PER_TUPLE * asking
    keyed = wide.keyed_rows(inputs, partitions, routing, semi_join)
    if where is Where.COLLECT:
        return StepPass(deltas, lambda function: _collect_and_run(step, keyed, function))
    return StepPass(deltas, lambda function: _run_in_tasks(step, keyed, function))


def _collect_and_run(step: StepContext, keyed: DataFrame, function: BucketStep) -> PassOutcome:
    """The keyed rows collected as Arrow (one Spark job: the reads, the hashes and the
    buckets' labels), then each bucket through ``function`` in the driver; in Spark tasks
    when the driver cannot take the rows."""
    try:
        rows = keyed.toArrow()
    except _COLLECT_ERRORS as e:
        _warn_hands_on(step.w, "collecting the step's rows", e)
        return _run_in_tasks(step, keyed, function)
    return _write_in_driver(step, step.wide.step_in_driver(rows, function))


def _write_in_driver(step: StepContext, result: pa.Table) -> PassOutcome:
    return write_collected(
        step.w, step.wide, result, step.routing, step.state.segments, step.plan, step.report
    )


def _run_in_tasks(step: StepContext, keyed: DataFrame, function: BucketStep) -> PassOutcome:
    result = step.wide.step(keyed, function)
    return run_and_write(
        step.w, step.wide, result, step.routing, step.state.segments, step.plan, step.report
    )


def _warn_hands_on(w: SsbjWiring, what: str, error: BaseException) -> None:
    logger.warning(
        "ssbj %s: %s failed (%s); it runs in Spark this step",
        w.name,
        what,
        str(error).splitlines()[0][:300],
    )
