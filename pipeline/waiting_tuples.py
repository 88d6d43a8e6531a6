"""Tuples that wait for master rows arriving after them (``operator.late_master``).

In a warehouse a dimension row often lands after the facts that need it (an order for a
customer whose row arrives minutes later). A tuple pinned to a master version without its
key would be dropped by an inner join or emitted unmatched by a left join, and never looked
at again. With ``late_master: {wait: ...}`` such a tuple waits instead, in the stage's late
table ``_operators/<stage>/late``: its input row plus ``_late_since`` (the time of the step
that first found no row) and ``_late_step`` (that step).

Every step of the stage probes the late table's tuples with its new tuples against the
step's master version (one flagged join):

- a matched tuple is answered from that version (the first probed version that has its key,
  recorded in the output's version column), and leaves the late table;
- an unmatched tuple whose wait expired (``_late_since <= step time - wait``) is emitted
  unmatched (left join) or dropped (inner join), as the plain join would have done at once;
- every other unmatched tuple is the late table's new content (one overwrite).

Without ``late_master`` (the config dropped it while tuples waited), the wait is zero: every
waiting tuple expires at the next step, so nothing is left behind.

Exactly once: the step's time and the late table version it reads (:class:`LatePlan`) are
saved in the state store before anything is written and reused by a rerun of the same step,
so a crash anywhere reruns to the same split; the output append and the late table's
overwrite carry the step's app transaction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import narwhals.stable.v2 as nw
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.rows import Frame, Rows, with_epoch_micros
from joins.columns import MATCHED, ROW_ID
from pipeline.late_table import LATE_COLUMNS, LATE_SINCE, LATE_STEP
from quality.audit_views import AGE_STEPS, MAX_AGE_STEPS, TUPLE_ID
from warehouse.delta import DeltaEngine
from warehouse.state_store import StateStore

__all__ = ["LATE_COLUMNS", "LATE_SINCE", "LATE_STEP", "LatePlan"]


@dataclass(frozen=True)
class LatePlan:
    """What a step of a stage with late tuples reads: fixed before it writes anything."""

    step: int
    at: datetime  # the step's time (UTC): waits are measured to it
    late_version: int | None  # the late table's version it reads; None: no table yet
    master_version: int | None = None  # the master version it probes

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "at": self.at.isoformat(),
            "late_version": self.late_version,
            "master_version": self.master_version,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatePlan:
        version, master = data.get("late_version"), data.get("master_version")
        return cls(
            int(data["step"]),
            datetime.fromisoformat(str(data["at"])),
            None if version is None else int(version),
            None if master is None else int(master),
        )


def state_key(stage: str) -> str:
    """The state store's key of a stage's late plan."""
    return f"late.{stage}"


def plan_late_step(
    store: StateStore,
    stage: str,
    step: int,
    late_version: int | None,
    master_version: int,
    now: datetime,
) -> LatePlan:
    """The plan of ``step``: the one saved for it by an earlier attempt, else a new one at
    ``now`` reading ``late_version`` against ``master_version``, saved before the step
    writes anything."""
    saved = saved_plan(store, stage)
    if saved is not None and saved.step == step:
        return saved
    plan = LatePlan(step, now.astimezone(UTC), late_version, master_version)
    store.save_operator_state(state_key(stage), {"plan": plan.to_dict()})
    return plan


def saved_plan(store: StateStore, stage: str) -> LatePlan | None:
    """The last late plan saved for ``stage``: of the step that last read the late table
    (done once the stage's offset records it)."""
    return saved_state(store, stage)[0]


def saved_state(store: StateStore, stage: str) -> tuple[LatePlan | None, datetime | None]:
    """The last saved late plan, and when the longest-waiting tuple entered as that step
    recorded it (None: unknown, or nothing waited); one read of the state store."""
    saved = store.operator_state(state_key(stage)) or {}
    plan, micros = saved.get("plan"), saved.get("oldest_waiting_us")
    return (
        None if plan is None else LatePlan.from_dict(plan),
        None if micros is None else datetime.fromtimestamp(int(micros) / 1e6, UTC),
    )


def waiting_records(engine: DeltaEngine, path: str) -> int | None:
    """Tuples in the late table at ``path`` by its log (0 without a table; None when its
    files carry no row counts)."""
    if not engine.exists(path):
        return 0
    return engine.snapshot(path).num_records


def record_waiting(store: StateStore, stage: str, plan: LatePlan, oldest_us: int | None) -> None:
    """Keep, beside the step's plan, when its longest-waiting tuple entered (``counts``)."""
    store.save_operator_state(
        state_key(stage), {"plan": plan.to_dict(), "oldest_waiting_us": oldest_us}
    )


def nothing_to_do(
    plan: LatePlan | None,
    master_version: int,
    oldest: datetime | None,
    wait: timedelta,
    now: datetime,
) -> bool:
    """Whether a step without new input would change nothing for the waiting tuples: the
    last one probed this master version already, and none of them (the ``oldest`` entered
    first; None: unknown) has waited its wait by ``now``."""
    if plan is None or plan.master_version != master_version or oldest is None:
        return False
    return oldest.astimezone(UTC) + wait > now.astimezone(UTC)


def probe_rows(new_rows: DataFrame, late: DataFrame | None, plan: LatePlan) -> DataFrame:
    """The step's new tuples, stamped as entering now, with the waiting ones."""
    stamped = new_rows.withColumn(LATE_SINCE, F.lit(plan.at).cast(T.TimestampType())).withColumn(
        LATE_STEP, F.lit(plan.step).cast(T.LongType())
    )
    return stamped if late is None else stamped.unionByName(late)


def expired(plan: LatePlan, wait: timedelta) -> Column:
    """Tuples whose wait is over at the step's time."""
    return F.col(LATE_SINCE) <= F.lit(plan.at - wait).cast(T.TimestampType())


def answered(joined: DataFrame, plan: LatePlan, wait: timedelta) -> DataFrame:
    """Rows of a flagged join the step emits: matches, and unmatched tuples whose wait is
    over (``baseline.finish`` keeps the latter for a left join only)."""
    return joined.where(F.col(MATCHED) | expired(plan, wait)).drop(*LATE_COLUMNS)


def still_waiting(
    joined: DataFrame, plan: LatePlan, wait: timedelta, columns: list[str]
) -> DataFrame:
    """The late table's next content: unmatched tuples still within their wait (a flagged
    join emits an unmatched tuple once), as the probe's ``columns``."""
    return joined.where(~F.col(MATCHED) & ~expired(plan, wait)).select(*columns)


def counts(joined: DataFrame, plan: LatePlan, wait: timedelta) -> dict[str, int]:
    """A step's counts over its flagged join (one job), and ``oldest_us``: when the
    longest-waiting tuple still waiting entered (microseconds since the epoch; None).

    Of the step's new tuples (the conservation view, ``pipeline.conservation``): ``new``,
    ``new_matched``, ``new_expired`` (unmatched, wait zero) and ``new_waiting``. Over all
    probed tuples: ``match_rows``, ``expired`` and ``waiting``; of the tuples that waited
    before this step: ``late_answered`` and ``late_expired``."""
    new = F.col(LATE_STEP) == F.lit(plan.step)
    matched, over = F.col(MATCHED), expired(plan, wait)
    unmatched_over, unmatched_waiting = ~matched & over, ~matched & ~over

    def tuples(condition: Column) -> Column:
        return F.count_distinct(F.when(condition, F.col(ROW_ID)))

    def rows(condition: Column) -> Column:
        return F.sum(condition.cast("long"))

    row = joined.agg(
        tuples(new).alias("new"),
        tuples(new & matched).alias("new_matched"),
        rows(new & unmatched_over).alias("new_expired"),
        rows(new & unmatched_waiting).alias("new_waiting"),
        rows(matched).alias("match_rows"),
        rows(unmatched_over).alias("expired"),
        rows(unmatched_waiting).alias("waiting"),
        tuples(~new & matched).alias("late_answered"),
        rows(~new & unmatched_over).alias("late_expired"),
        F.min(F.when(unmatched_waiting, F.unix_micros(F.col(LATE_SINCE)))).alias("oldest_us"),
    ).first()
    assert row is not None
    counted = {name: int(row[name] or 0) for name in row.asDict() if name != "oldest_us"}
    counted["oldest_us"] = row["oldest_us"]  # None when nothing waits
    return counted


def waiting_ages(
    late: Rows, id_column: str, wait: timedelta, interval: timedelta, now: datetime
) -> Rows:
    """The audit's ``audit_pending`` rows of the waiting tuples (``id_column`` and
    ``_late_since``), in schedule intervals: how long each has waited by ``now`` (floored
    to whole intervals), against its wait plus the interval a step may take to come
    (``quality.audit_views``). Time, not steps: extra runs (a drain, a manual run) make
    extra steps, not a longer wait."""
    return Rows.apply(
        _waiting_ages,
        late,
        id_column=id_column,
        interval_us=int(interval.total_seconds() * 1_000_000),
        now_us=int(now.timestamp() * 1_000_000),
        max_age=math.ceil(wait / interval) + 1,
    )


def _waiting_ages(
    late: Frame, id_column: str, interval_us: int, now_us: int, max_age: int
) -> Frame:
    since = with_epoch_micros(late, LATE_SINCE, "_since_us")
    return since.select(
        nw.col(id_column).alias(TUPLE_ID),
        ((nw.lit(now_us, nw.Int64()) - nw.col("_since_us")) // interval_us)
        .cast(nw.Int64())
        .alias(AGE_STEPS),
        nw.lit(max_age, nw.Int64()).alias(MAX_AGE_STEPS),
    )
