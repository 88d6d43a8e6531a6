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

Also here, what a step reads at the versions its plan fixed, in the form its place needs
(by Spark, or by pyarrow for a step that runs in the driver): the new input rows, the
operator's stored state, partition ``step mod k`` of every master version the step meets
(``pipeline.ssbj.scan_copy``) and the master's changes that bring the cache forward, laid
out as the wide table's rows (``joins.ssbj.wide_table``). Tuples whose interval a backfill
has already joined and published are left out of every read (their live output is
suppressed), and v_S and v_R (Eq. 1) are measured here once per stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import narwhals.stable.v2 as nw
import pyarrow as pa
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from common.errors import NotAppendOnlyError
from common.rows import Native, Rows
from joins.columns import INTERVAL_START
from joins.skew.key_routing import KeyRouting
from joins.ssbj.algorithm import Schedule
from joins.ssbj.bucket_decode import BucketDeltas
from joins.ssbj.buckets import BucketStep
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.rcycle import StepPosition
from joins.ssbj.late import LATE_SINCE
from joins.ssbj.roles import PENDING, ROLE, stream_field
from joins.ssbj.step import INPUT_VERSION
from joins.ssbj.wide_table import WideTable
from pipeline.row_bytes import measured_row_bytes
from pipeline.ssbj.commit import PassOutcome, run_and_write, write_collected
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.scan_copy import partition
from pipeline.ssbj.state import ControllerState, SavedPlan
from pipeline.ssbj.wiring import STATE_TABLE, SsbjWiring
from warehouse.delta import DataFile, Snapshot
from warehouse.delta.api import CHANGE_TYPE, records_in

logger = logging.getLogger(__name__)

# (pinned master version, the table version read, its files) of a step's master partitions.
PartitionScans = list[tuple[int, Snapshot, list[DataFile]]]

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
    scans: PartitionScans,
) -> Where:
    """Where the step runs, from its expected size and the features it uses. In the
    driver the master rows no tuple asks for are dropped as each file is read, so only
    what the step keeps counts against ``collect_rows``; a collect ships them all."""
    if reads_in_driver(w, reads, wide, routing) and collects(w, state, asking, 0):
        return Where.DRIVER
    if collects(w, state, asking, sum(records_in(files) for _, _, files in scans)):
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
    scans: PartitionScans,
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
            keyed_rows = keyed_rows_in_driver(w, state, plan, scans, wide, routing, report)
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
    inputs, partitions, deltas = spark_inputs(
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


# ---------------------------------------------------------------------- the master


def partition_scans(
    w: SsbjWiring, plan: SavedPlan, position: StepPosition, master: Snapshot, reads: Schedule
) -> PartitionScans:
    """(pinned master version, table version, files) of the step's partition of every
    master version it meets, in version order (``scan_copy.partition``), from the logs: the
    collect estimate counts their rows, and either read takes them."""
    found = []
    for pinned in sorted(reads.partition_versions):
        snapshot = master if pinned == master.version else w.engine.snapshot(w.master_path, pinned)
        table, files = partition(w, snapshot, position.partition, position.partitions, plan.scan)
        found.append((pinned, table, files))
    return found


def master_deltas(
    w: SsbjWiring, reads: Schedule, master: Snapshot, wide: WideTable
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
            changes = w.engine.changes(w.master_path, base, master.version)
        except NotAppendOnlyError as e:
            logger.info(
                "ssbj %s: master %s changed between v%d and v%d without a change feed "
                "(%s); reading the tracked values again at v%d",
                w.name,
                w.master_path,
                base,
                master.version,
                e,
                master.version,
            )
            if not reloaded:
                frames.append(wide.reload_rows(w.engine.read_files(master)))
                reloaded = True
            return "reload"
        frames.append(wide.change_rows(changes, CHANGE_TYPE, for_switch))
        return "changes"

    cache = kind(reads.cache_from, for_switch=False)
    switch = kind(reads.switch_from, for_switch=True)
    return BucketDeltas(cache=cache, switch=switch), frames


# ---------------------------------------------------------------------- the step's rows


def new_rows(w: SsbjWiring, state: ControllerState, plan: SavedPlan) -> DataFrame:
    """The step's new input rows, without those a backfill already joined."""
    return suppressed(
        w.new_rows(plan.input_from, plan.input_to).to_spark(), state, INTERVAL_START, INPUT_VERSION
    )


def new_rows_schema(w: SsbjWiring, plan: SavedPlan, rows: Callable[[], DataFrame]) -> StructType:
    """The Spark schema of the step's new input rows (:func:`new_rows`), asking the
    DataFrame ``rows`` builds only the first time this process meets the input table's
    schema (``pipeline.ssbj.warm``)."""
    key = w.engine.snapshot(w.input_path, int(plan.input_to)).schema.json()
    known = w.warm.input_schemas.get(key)
    if known is None:
        known = w.warm.input_schemas[key] = rows().schema
    return known


def asking_tuples(w: SsbjWiring, state: ControllerState, plan: SavedPlan) -> int:
    """The tuples that probe this step's master partition: H_S after the last step, the
    late rows (any may return) and the new input's rows (from the input's commit
    files, no Spark job)."""
    new = 0
    if plan.input_to > plan.input_from:
        new = sum(
            rows
            for _, rows in w.engine.rows_by_version(
                w.input_path, int(plan.input_from), int(plan.input_to)
            )
        )
    return int(state.pending_rows) + int(state.late_rows) + new


def spark_inputs(
    w: SsbjWiring,
    state: ControllerState,
    plan: SavedPlan,
    scans: PartitionScans,
    master: Snapshot,
    reads: Schedule,
    wide: WideTable,
    rows: DataFrame,
    report: SsbjStepReport,
) -> tuple[list[DataFrame], list[DataFrame], BucketDeltas]:
    """The step's wide inputs (new tuples ``rows``, stored state, master changes) and the
    master partition rows of every version it meets (``scans``: :func:`partition_scans`)."""
    inputs = [wide.stream_rows(rows)]
    partitions: list[DataFrame] = []
    if STATE_TABLE in plan.tables:
        stored = stored_state(w, plan.tables[STATE_TABLE]).to_spark()
        inputs.append(suppressed_pending(wide.state_rows(stored), state))
    for pinned, table, files in scans:
        master_rows = w.engine.read_files(table, files).select(*w.spec.master_columns)
        partitions.append(wide.partition_rows(master_rows, pinned))
        report.master_bytes_read += sum(f.size_bytes for f in files)
        report.master_rows_read += records_in(files)
    deltas, changed = master_deltas(w, reads, master, wide)
    return inputs + changed, partitions, deltas


def keyed_rows_in_driver(
    w: SsbjWiring,
    state: ControllerState,
    plan: SavedPlan,
    scans: PartitionScans,
    wide: WideTable,
    routing: KeyRouting,
    report: SsbjStepReport,
) -> pa.Table:
    """The step's keyed rows read and laid out in the driver (:func:`spark_inputs` and
    ``WideTable.keyed_rows`` in memory): new tuples, stored state, master partitions."""
    # One chunk, not one per input file: the misses enter H_S as this step's chunk and
    # stay k steps, and a pass over H_S held in one Arrow chunk per input version (59
    # of them at 0.5 x M) cost 15-20% more than over one per entry step.
    new = w.new_rows(plan.input_from, plan.input_to).to_arrow().combine_chunks()
    new = suppressed(new, state, INTERVAL_START, INPUT_VERSION)
    inputs = [wide.stream_rows(new)]
    if STATE_TABLE in plan.tables:
        rows = wide.state_rows(stored_state(w, plan.tables[STATE_TABLE]).to_arrow())
        inputs.append(suppressed_pending(rows, state))
    partitions = []
    read: list[DataFile] = []
    # Only the master rows a tuple asks for leave each file as it is read: a partition
    # costs the decode of its files (every column: Parquet has no row selection), not the
    # memory of its rows.
    asked = wide.asked_keys(inputs)
    bounds = asked.bounds() if asked is not None else {}
    for pinned, table, partition_files in scans:
        files = [f for f in partition_files if _may_hold(f, bounds)]
        master_rows = w.engine.read_arrow(
            table,
            files,
            w.spec.master_columns,
            asked.row_mask if asked is not None else None,
        )
        partitions.append(wide.partition_rows(master_rows, pinned))
        read += files
    keyed = wide.keyed_rows_arrow(inputs, partitions, routing)
    report.master_bytes_read += sum(f.size_bytes for f in read)
    report.master_rows_read += records_in(read)
    return keyed


def stored_state(w: SsbjWiring, version: int) -> Rows:
    """The state table's rows at ``version``. In the driver: from memory when this process
    committed that version (``pipeline.ssbj.warm``), else read from its files."""

    def in_driver() -> pa.Table:
        held = w.warm.held_state(w.state_path, version)
        if held is not None:
            return held
        return w.engine.read_arrow(w.engine.snapshot(w.state_path, version))

    return Rows.read(arrow=in_driver, spark=lambda: w.engine.read(w.state_path, version=version))


def _may_hold(file: DataFile, bounds: dict[str, tuple[Any, Any] | None]) -> bool:
    """Whether ``file`` may hold a master row asked for: not when a key asked for
    nothing, or its log statistics put that key outside the asked range."""
    for column, bound in bounds.items():
        if bound is None or not file.may_hold(column, *bound):
            return False
    return True


# ---------------------------------------------------------------------- backfills


def covered(state: ControllerState, interval: str, input_version: str) -> nw.Expr | None:
    """True for tuples whose interval a backfill has already joined and published (a null
    interval or version is not covered); None without backfills. One predicate for rows
    on Spark and in the driver."""
    found = None
    for backfill in state.backfills:
        term = (
            (nw.col(interval) >= nw.lit(_utc(backfill["start"])))
            & (nw.col(interval) < nw.lit(_utc(backfill["end"])))
            & (nw.col(input_version) <= int(backfill["input_version"]))
        )
        found = term if found is None else found | term
    return None if found is None else found.fill_null(False)


def suppressed(rows: Native, state: ControllerState, interval: str, input_version: str) -> Native:
    """``rows`` (a Spark frame or an Arrow table) without the tuples a backfill already
    joined and published."""
    found = covered(state, interval, input_version)
    return rows if found is None else nw.from_native(rows).filter(~found).to_native()


def suppressed_pending(rows: Native, state: ControllerState) -> Native:
    """Stored state rows without the H_S tuples a backfill already joined."""
    found = covered(state, stream_field(INTERVAL_START), stream_field(INPUT_VERSION))
    if found is None:
        return rows
    # Tuples waiting for late master rows are not the backfill's (it leaves them to the
    # live steps, ``SsbjDriver.backfill``): only H_S tuples that never waited are.
    held = (nw.col(ROLE) == PENDING) & nw.col(LATE_SINCE).is_null()
    return nw.from_native(rows).filter(~(held & found)).to_native()


def _utc(moment: str) -> datetime:
    """An ISO time as the backfill recorded it, naive ones read as UTC (Spark's session
    time zone, in which the Spark path casts them)."""
    parsed = datetime.fromisoformat(moment)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# ---------------------------------------------------------------------- v_S and v_R


def measure_sizes(
    w: SsbjWiring, rows: Callable[[], DataFrame], master: Snapshot
) -> TupleSizes | None:
    """v_S and v_R measured as Arrow bytes of sampled projected rows (the new input's,
    ``rows`` builds them); None when there is nothing to measure yet. Measured once per
    stage, and kept in the controller state (:meth:`ControllerState.with_sizes`)."""
    stream_bytes = measured_row_bytes(rows().drop(INPUT_VERSION))
    master_bytes = measured_row_bytes(w.engine.read_files(master).select(*w.spec.master_columns))
    if stream_bytes is None or master_bytes is None:
        return None
    logger.info("ssbj %s: measured v_S=%.1f B, v_R=%.1f B", w.name, stream_bytes, master_bytes)
    return TupleSizes(stream_bytes, master_bytes)
