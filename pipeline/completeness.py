"""Completeness per output table and event-time interval: answered and published, or waiting.

The rule (DESIGN, "Freshness and completeness"): interval ``I`` (the tuples'
``_interval_start``) of output ``T`` is **complete** when

- no root-stream tuple of ``I`` waits anywhere in ``T``'s chain (``T``'s stage and the
  stages upstream of it): none is pending in a stage (SSBJ's H_S, a late table), none is
  still in a stage's input table beyond the version the stage consumed, and none was
  answered into a batch of ``T`` that is quarantined and not resolved (not published); and
- the validated run's window ends at or after ``I``'s end (without a window: now), so no
  more of ``I``'s tuples are due.

``tuples`` counts ``I``'s root-stream tuples (its bronze rows); the share answered and
published is ``(tuples - waiting - quarantined) / tuples``. An incomplete interval is
**overdue** once ``I``'s end plus the chain's freshness bound is past.

Computed at the end of every successful live ``validate`` and ``backfill`` (over the
backfill's window), after the publish, in the
driver's memory over Arrow reads of the Delta tables (no Spark job with the embedded
engine): the bronze rows added since the last count (kept per interval), each chain stage's
unconsumed input rows and its pending tuples. Only intervals that may change are evaluated
(those not complete yet, with new or waiting tuples, or in the run's window), and they are
written with the bronze version counted in one state-store transaction, so a retried
validate records the same rows. A record keeps when and by which run its interval became
complete; an interval that takes late tuples after that becomes complete anew once they
are answered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import PipelineConfig
from pipeline.freshness import FreshnessBound
from pipeline.late_table import LATE_SINCE
from pipeline.pins import PinHolder
from pipeline.stage_config import EquiStage, ThetaStage
from warehouse.state_completeness import IntervalRecord
from warehouse.state_store import StateStore

if TYPE_CHECKING:
    from pipeline.drivers import StageDrivers
    from pipeline.stage_driver import StageDriver

logger = logging.getLogger(__name__)

RECENT_INTERVALS = 6  # what status and the run report show of each output, besides the open
OPEN_SHOWN = 50  # incomplete intervals shown at most besides the recent ones
_ID, _ENTERED = "_tuple_id", "_entered_at"
_TIME = pa.timestamp("us", "UTC")


@dataclass(frozen=True)
class Observed:
    """What one evaluation reads of one interval: tuples added to the root stream since the
    last count, tuples waiting in the chain now (and when the longest-waiting one entered
    the stage it waits in, where known), and tuples held in unresolved quarantine."""

    new_tuples: int = 0
    waiting: int = 0
    quarantined: int = 0
    oldest_entered_at: datetime | None = None


def table_chain(config: PipelineConfig, table: str) -> list[EquiStage | ThetaStage]:
    """``table``'s stage and the stages upstream of it, the one reading the root stream
    first."""
    stages: list[EquiStage | ThetaStage] = []
    name = table
    while name not in config.streams:
        stage = config.producing_stage(name)
        stages.append(stage)
        name = stage.input
    return stages[::-1]


def chain_bound(config: PipelineConfig, table: str) -> FreshnessBound:
    """How long a tuple may wait for ``table``'s answer: the chain's stages run in order in
    every run, so a tuple a stage answers at the end of its bound's last run enters the next
    stage in that run: ``B_1 + ... + B_n - (n - 1)`` intervals."""
    interval = config.schedule.interval_delta
    bounds = [stage.freshness.bound(interval).intervals for stage in table_chain(config, table)]
    return FreshnessBound(sum(bounds) - len(bounds) + 1, interval)


def interval_floor(moment: datetime, interval: timedelta) -> datetime:
    """The start of the schedule interval ``moment`` falls in (``_interval_start``'s rule:
    a multiple of the interval since the epoch)."""
    seconds = int(interval.total_seconds())
    epoch = int(moment.timestamp()) // seconds * seconds
    return datetime.fromtimestamp(epoch, UTC)


def window_intervals(start: datetime, end: datetime, interval: timedelta) -> list[datetime]:
    """The starts of the intervals that lie wholly in ``[start, end)``."""
    first = interval_floor(start, interval)
    if first < start:
        first += interval
    starts = []
    while first + interval <= end:
        starts.append(first)
        first += interval
    return starts


def evaluate(
    table: str,
    prior: Mapping[datetime, IntervalRecord],
    observed: Mapping[datetime, Observed],
    interval: timedelta,
    window_end: datetime,
    run_id: str,
    now: datetime,
) -> list[IntervalRecord]:
    """The new records of every interval in ``prior`` (its last records) or ``observed``,
    oldest first. A complete interval keeps the time and run that completed it while it
    stays complete and takes no new tuple; otherwise one that is complete now was
    completed by ``run_id`` at ``now``."""
    records = []
    for start in sorted(set(prior) | set(observed)):
        before = prior.get(start)
        seen = observed.get(start, Observed())
        tuples = (before.tuples if before is not None else 0) + seen.new_tuples
        if seen.waiting + seen.quarantined > tuples:
            logger.warning(
                "completeness of %s, interval %s: %d tuple(s) wait or are quarantined, but "
                "only %d were counted in the root stream; expected no more than that",
                table,
                start.isoformat(),
                seen.waiting + seen.quarantined,
                tuples,
            )
        end = start + interval
        complete = seen.waiting == 0 and seen.quarantined == 0 and window_end >= end
        completed_at, completed_by = (now, run_id) if complete else (None, None)
        if before is not None and before.complete and complete and not seen.new_tuples:
            completed_at, completed_by = before.completed_at, before.completed_run_id
        records.append(
            IntervalRecord(
                table=table,
                interval_start=start,
                interval_end=end,
                tuples=tuples,
                waiting=seen.waiting,
                quarantined=seen.quarantined,
                oldest_waiting_entered_at=seen.oldest_entered_at if seen.waiting else None,
                complete=complete,
                completed_at=completed_at,
                completed_run_id=completed_by,
                run_id=run_id,
            )
        )
    return records


# ---------------------------------------------------------------------- reading the chain


def record_completeness(
    drivers: StageDrivers,
    run_id: str,
    window: tuple[datetime | None, datetime | None],
    quarantined: Callable[[str], pa.Table | None],
) -> dict[str, list[IntervalRecord]]:
    """Evaluate and record the completeness of every output after a live ``validate``; the
    records written, per table. ``window`` is the validated run's data interval (either
    end None: no window); ``quarantined(table)`` gives the rows (the root stream's id
    column and ``_interval_start``) of the table's unresolved quarantined batches (None:
    there are none)."""
    config, store = drivers.config, drivers.store
    started = time.perf_counter()
    now = datetime.now(UTC)
    start, end = window
    interval = config.schedule.interval_delta
    in_window = window_intervals(start, end, interval) if start and end else []
    counted: dict[tuple[str, int, int], dict[datetime, int]] = {}
    in_stage: dict[str, _Held] = {}  # per stage: outputs of one chain share its upstream
    written = {}
    for table in config.outputs():
        stages = table_chain(config, table)
        first = stages[0]
        bronze = drivers.inputs.input_path(first)
        key = PinHolder.COMPLETENESS.of(table)  # its progress's state key, and its pins' holder
        after = int((store.operator_state(key) or {}).get("counted_version", 0))
        latest = drivers.engine.snapshot(bronze).version if drivers.engine.exists(bronze) else 0
        if (bronze, after, latest) not in counted:
            counted[(bronze, after, latest)] = _new_tuples(drivers, first, after, latest)
        id_column = config.streams[config.root_stream(table)].id_column
        held = quarantined(table)
        for stage in stages:
            if stage.name not in in_stage:
                in_stage[stage.name] = _held_in(drivers, stage)
        observed = _observe(
            counted[(bronze, after, latest)],
            [in_stage[stage.name] for stage in stages],
            None if held is None else _id_pairs(held, id_column),
            in_window,
        )
        prior = {r.interval_start: r for r in store.interval_records(table, starts=list(observed))}
        records = evaluate(table, prior, observed, interval, end or now, run_id, now)
        store.save_completeness(
            records,
            (key, {"counted_version": max(after, latest)}),
            (key, {bronze: [max(after, latest)]}),
        )
        done = [r for r in records if r.completed_run_id == run_id and r.completed_at == now]
        logger.info(
            "completeness of %s: %d interval(s) evaluated, %d incomplete, %d became complete%s",
            table,
            len(records),
            sum(not r.complete for r in records),
            len(done),
            f" ({', '.join(r.interval_start.isoformat() for r in done)})" if done else "",
        )
        written[table] = records
    logger.info("completeness recorded in %.2fs", time.perf_counter() - started)
    return written


def _observe(
    new: Mapping[datetime, int],
    chain: Sequence[_Held],
    quarantined: pa.Table | None,
    in_window: Iterable[datetime],
) -> dict[datetime, Observed]:
    """Per interval: what :func:`evaluate` reads of it. A tuple waiting in two stages of
    the chain (some rows emitted, still pending) counts once."""
    ids = [pairs for stage in chain for pairs in stage.ids]
    held = (
        _distinct_per_interval(pa.concat_tables(ids, promote_options="permissive")) if ids else {}
    )
    entered: dict[datetime, datetime] = {}
    for stage in chain:
        for start, at in stage.entered.items():
            entered[start] = min(at, entered.get(start, at))
    kept = _distinct_per_interval(quarantined) if quarantined is not None else {}
    starts = set(new) | set(held) | set(kept) | set(in_window)
    return {
        start: Observed(
            new.get(start, 0), held.get(start, 0), kept.get(start, 0), entered.get(start)
        )
        for start in starts
    }


def _new_tuples(
    drivers: StageDrivers, first: EquiStage | ThetaStage, after: int, to: int
) -> dict[datetime, int]:
    """The root-stream rows added in ``(after, to]``, counted per interval."""
    if to <= after:
        return {}
    from joins.columns import INTERVAL_START

    rows = drivers.inputs.new_rows(first, after, to).to_arrow()
    starts = pc.cast(rows.column(INTERVAL_START), _TIME).drop_null()
    return {entry["values"]: int(entry["counts"]) for entry in pc.value_counts(starts).to_pylist()}


@dataclass(frozen=True)
class _Held:
    """What waits in one stage: (tuple id, ``_interval_start``) pairs, and per interval when
    its longest-waiting tuple entered the stage (where known)."""

    ids: list[pa.Table]
    entered: Mapping[datetime, datetime]


def _held_in(drivers: StageDrivers, stage: EquiStage | ThetaStage) -> _Held:
    """The tuples ``stage`` holds pending and those in its input beyond its consumed
    version."""
    from joins.columns import INTERVAL_START

    driver = drivers.driver(stage)
    id_column = drivers.config.streams[drivers.config.root_stream(stage.input)].id_column
    input_path = drivers.inputs.input_path(stage)
    consumed = driver.consumed_version()
    latest = (
        drivers.engine.snapshot(input_path).version
        if drivers.engine.exists(input_path)
        else consumed
    )
    sources = []
    if latest > consumed:
        sources.append(
            drivers.inputs.new_rows(stage, consumed, latest, keep_version=True).to_arrow()
        )
    pending = _pending(drivers, driver, id_column)
    if pending is not None:
        sources.append(pending)
    ids: list[pa.Table] = []
    entered: dict[datetime, datetime] = {}
    for rows in sources:
        pairs = _id_pairs(rows, id_column)
        ids.append(pairs)
        starts = pairs.column(INTERVAL_START)
        for start, at in _entry_times(drivers, input_path, rows, starts):
            entered[start] = min(at, entered.get(start, at))
    return _Held(ids, entered)


def _pending(drivers: StageDrivers, driver: StageDriver, id_column: str) -> pa.Table | None:
    """The tuples ``driver`` holds pending now, with ``_late_since`` where the stage keeps
    it (SSBJ's state does; a plain join's late table is read for it beside its tuples)."""
    path, version = driver.pending_table(), driver.pending_version()
    if path is None or version is None:
        return None
    rows = driver.pending_at(version).to_arrow()
    if LATE_SINCE in rows.column_names or not rows.num_rows:
        return rows
    snapshot = drivers.engine.snapshot(path, version)
    if LATE_SINCE not in snapshot.schema.fieldNames():
        return rows
    since = drivers.engine.read_arrow(snapshot, columns=[id_column, LATE_SINCE])
    return rows.join(since, id_column, join_type="left outer")


def _entry_times(
    drivers: StageDrivers, input_path: str, rows: pa.Table, starts: pa.ChunkedArray
) -> list[tuple[datetime, datetime]]:
    """(interval, when its earliest tuple in ``rows`` entered the stage): the commit time of
    the input version that brought it, else when it began to wait for a late master row."""
    from joins.ssbj.step import INPUT_VERSION

    found: list[tuple[datetime, datetime]] = []
    if INPUT_VERSION in rows.column_names:
        for start, version in _least_per_interval(starts, rows.column(INPUT_VERSION)):
            at = _commit_time(drivers, input_path, version)
            if at is not None:
                found.append((start, at))
    if LATE_SINCE in rows.column_names:
        found += _least_per_interval(starts, pc.cast(rows.column(LATE_SINCE), _TIME))
    return found


def _least_per_interval(starts: pa.ChunkedArray, values: pa.ChunkedArray) -> list[Any]:
    """(interval, the least of ``values`` in it) for each interval with a value."""
    least = (
        pa.table({"start": starts, "value": values}).group_by("start").aggregate([("value", "min")])
    )
    return [
        (e["start"], e["value_min"])
        for e in least.to_pylist()
        if e["start"] is not None and e["value_min"] is not None
    ]


def _commit_time(drivers: StageDrivers, path: str, version: int) -> datetime | None:
    """When ``version`` of the table at ``path`` was committed (its commit information's
    ``timestamp``); None when unknown."""
    for _, info in drivers.engine.commit_infos(path, int(version) - 1, int(version)):
        stamp = info.get("timestamp")
        if stamp is not None:
            return datetime.fromtimestamp(int(stamp) / 1000, UTC)
    return None


def _id_pairs(rows: pa.Table, id_column: str) -> pa.Table:
    """``rows``' tuple ids and intervals, in the names the counting reads."""
    from joins.columns import INTERVAL_START

    return pa.table(
        {_ID: rows.column(id_column), INTERVAL_START: pc.cast(rows.column(INTERVAL_START), _TIME)}
    )


def _distinct_per_interval(ids: pa.Table) -> dict[datetime, int]:
    """Distinct tuple ids per interval of (id, ``_interval_start``) pairs."""
    from joins.columns import INTERVAL_START

    if not ids.num_rows:
        return {}
    counts = ids.group_by(INTERVAL_START).aggregate([(_ID, "count_distinct")])
    return {
        e[INTERVAL_START]: int(e[f"{_ID}_count_distinct"])
        for e in counts.to_pylist()
        if e[INTERVAL_START] is not None
    }


# ---------------------------------------------------------------------- showing it


def share_published(record: IntervalRecord) -> float:
    """The share of the interval's tuples answered and published (1.0 without tuples)."""
    if record.tuples <= 0:
        return 1.0
    published = record.tuples - record.waiting - record.quarantined
    return max(0.0, min(1.0, published / record.tuples))


def is_overdue(record: IntervalRecord, bound: FreshnessBound, now: datetime) -> bool:
    """Incomplete past the freshness bound: the interval's end plus the bound is past."""
    return not record.complete and record.interval_end + bound.duration < now


def interval_view(record: IntervalRecord, bound: FreshnessBound, now: datetime) -> dict[str, Any]:
    """One interval as ``enrich status --json`` and the run report show it."""
    return {
        "interval_start": record.interval_start,
        "interval_end": record.interval_end,
        "tuples": record.tuples,
        "waiting": record.waiting,
        "quarantined": record.quarantined,
        "share_answered": share_published(record),
        "oldest_waiting_entered_at": record.oldest_waiting_entered_at,
        "complete": record.complete,
        "completed_at": record.completed_at,
        "completed_run_id": record.completed_run_id,
        "overdue": is_overdue(record, bound, now),
    }


def completeness_status(
    config: PipelineConfig,
    store: StateStore,
    now: datetime | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> dict[str, Any]:
    """Per output: its chain's freshness bound, the intervals shown (the latest
    ``RECENT_INTERVALS``, or those starting in ``[since, until)`` when either is given,
    and every incomplete one), newest first, the oldest waiting tuple's interval and entry
    time, and how many intervals are overdue. Reads only the state store."""
    moment = now or datetime.now(UTC)
    tables = {}
    for table in config.outputs():
        bound = chain_bound(config, table)
        ranged = since is not None or until is not None
        shown = {
            r.interval_start: r
            for r in [
                *store.interval_records(
                    table,
                    latest=None if ranged else RECENT_INTERVALS,
                    since=since,
                    until=until,
                ),
                *store.interval_records(table, incomplete=True, latest=OPEN_SHOWN),
            ]
        }
        records = [shown[start] for start in sorted(shown, reverse=True)]
        waiting = [r for r in records if r.waiting]
        oldest = min(waiting, key=lambda r: r.interval_start) if waiting else None
        tables[table] = {
            "freshness_bound": bound.describe(),
            "intervals": [interval_view(r, bound, moment) for r in records],
            "oldest_waiting": None
            if oldest is None
            else {
                "interval_start": oldest.interval_start,
                "entered_at": oldest.oldest_waiting_entered_at,
            },
            "overdue": sum(is_overdue(r, bound, moment) for r in records),
        }
    return tables


# ---------------------------------------------------------------------- Airflow Asset events


def published_extra(
    config: PipelineConfig,
    store: StateStore,
    table: str,
    run_id: str,
    window: tuple[datetime, datetime] | None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The ``extra`` of ``table``'s gold Asset event after run ``run_id``'s validate: the
    run's interval (the intervals in its window; without one, the latest recorded),
    whether it is complete, its share answered and published, and the intervals this run
    completed. JSON values only."""
    moment = now or datetime.now(UTC)
    if window is not None:
        records = store.interval_records(table, since=window[0], until=window[1])
    else:
        records = store.interval_records(table, latest=1)
    bound = chain_bound(config, table)
    tuples = sum(r.tuples for r in records)
    unpublished = sum(r.waiting + r.quarantined for r in records)
    span = window
    if span is None and records:
        span = (min(r.interval_start for r in records), max(r.interval_end for r in records))
    completed = store.intervals_completed_by(run_id, table)
    return {
        "run_id": run_id,
        "interval_start": _iso(span[0]) if span else None,
        "interval_end": _iso(span[1]) if span else None,
        "complete": bool(records) and all(r.complete for r in records),
        "share_answered": 1.0 if tuples <= 0 else max(0.0, (tuples - unpublished) / tuples),
        "tuples": tuples,
        "waiting": sum(r.waiting for r in records),
        "overdue": any(is_overdue(r, bound, moment) for r in records),
        "completed_intervals": [_iso(r.interval_start) for r in completed],
    }


def completed_extra(store: StateStore, table: str, run_id: str) -> dict[str, Any] | None:
    """The ``extra`` of ``table``'s ``complete`` Asset event: the intervals run ``run_id``
    completed (older ones an earlier run left incomplete included), oldest first; None
    when it completed none (no event)."""
    completed = store.intervals_completed_by(run_id, table)
    if not completed:
        return None
    return {
        "run_id": run_id,
        "intervals": [
            {
                "interval_start": _iso(r.interval_start),
                "interval_end": _iso(r.interval_end),
                "tuples": r.tuples,
                "completed_at": _iso(r.completed_at),
            }
            for r in completed
        ],
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat()
