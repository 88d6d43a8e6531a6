"""What an SSBJ step reads, at the versions its plan fixed: the new input rows, the
operator's stored state, partition ``step mod k`` of every master version the step meets
(``pipeline.ssbj.scan_copy``) and the master's changes that bring the cache forward, laid
out as the wide table's rows (``joins.ssbj.step.WideTable``), by Spark or, for a step that
runs in the driver, by pyarrow.

Tuples whose interval a backfill has already joined and published are left out of every
read (their live output is suppressed), and v_S and v_R (Eq. 1) are measured here once per
stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import narwhals.stable.v2 as nw
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from common.errors import NotAppendOnlyError
from common.rows import Native, Rows
from joins.columns import INTERVAL_START
from joins.skew.key_routing import KeyRouting
from joins.ssbj.algorithm import Schedule
from joins.ssbj.bucket_decode import BucketDeltas
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.rcycle import StepPosition
from joins.ssbj.late import LATE_SINCE
from joins.ssbj.roles import PENDING, ROLE, stream_field
from joins.ssbj.step import INPUT_VERSION
from joins.ssbj.wide_table import WideTable
from pipeline.row_bytes import measured_row_bytes
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.scan_copy import partition
from pipeline.ssbj.state import ControllerState, SavedPlan
from pipeline.ssbj.wiring import STATE_TABLE, SsbjWiring
from warehouse.delta import DataFile, Snapshot
from warehouse.delta.api import CHANGE_TYPE

logger = logging.getLogger(__name__)

# (pinned master version, the table version read, its files) of a step's master partitions.
PartitionScans = list[tuple[int, Snapshot, list[DataFile]]]


def file_rows(files: Iterable[Any]) -> int:
    """The rows of ``files`` by their log statistics."""
    return sum(f.num_records or 0 for f in files)


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
        report.master_rows_read += file_rows(files)
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
    # costs the scan of its key columns, not its rows' memory.
    asked = wide.asked_keys(inputs)
    bounds = asked.bounds() if asked is not None else {}
    for pinned, table, partition_files in scans:
        files = [f for f in partition_files if _may_hold(f, bounds)]
        master_rows = w.engine.read_arrow(
            table,
            files,
            w.spec.master_columns,
            asked.row_filter() if asked is not None else None,
        )
        partitions.append(wide.partition_rows(master_rows, pinned))
        read += files
    keyed = wide.keyed_rows_arrow(inputs, partitions, routing)
    report.master_bytes_read += sum(f.size_bytes for f in read)
    report.master_rows_read += file_rows(read)
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
