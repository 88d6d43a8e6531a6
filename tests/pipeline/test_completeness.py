"""Completeness per output and interval: the rule on hand-made records, then the records a
live ``validate`` writes over tiny pipelines (SSBJ holding tuples across runs, a chained
stage, a quarantined batch, a tuple waiting for a late master row), a retried validate, and
what status and the Asset events show.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.errors import ValidationFailedError
from pipeline.completeness import (
    Observed,
    chain_bound,
    completed_extra,
    completeness_status,
    evaluate,
    published_extra,
    table_chain,
    window_intervals,
)
from pipeline.config import PipelineConfig, parse_config
from pipeline.context import PipelineContext
from pipeline.handles import PipelineHandles
from pipeline.layout import WarehouseLayout
from pipeline.runner import PipelineRunner
from pipeline.schemas import bronze_schema
from tests.helpers import equi_stage, tiny_pipeline
from tests.pipeline.late_harness import LateHarness
from tests.pipeline.ssbj_harness import MASTER_SCHEMA, SsbjHarness
from warehouse.delta import AppTransaction, DeltaEngine, open_engine
from warehouse.state_completeness import IntervalRecord
from warehouse.state_store import StateStore

HOUR = dt.timedelta(hours=1)
I0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)  # SsbjHarness.arrive's event times fall in it
I1, I2, I3 = I0 + HOUR, I0 + 2 * HOUR, I0 + 3 * HOUR
NOW = dt.datetime(2024, 1, 2, tzinfo=dt.UTC)
MASTER = [(k, s, float(10 * k + s)) for k in range(1, 6) for s in range(k % 3)]


def record(start: dt.datetime, tuples: int, complete: bool, run_id: str) -> IntervalRecord:
    return IntervalRecord(
        "out",
        start,
        start + HOUR,
        tuples,
        0 if complete else 1,
        0,
        None,
        complete,
        NOW - HOUR if complete else None,
        run_id if complete else None,
        run_id,
    )


# ---------------------------------------------------------------------- the rule


def test_an_interval_is_complete_when_nothing_waits_and_its_window_has_ended() -> None:
    observed = {
        I0: Observed(new_tuples=4),  # all answered, window over it
        I1: Observed(new_tuples=3, waiting=1, oldest_entered_at=I1 + HOUR),  # one waits
        I2: Observed(new_tuples=2, quarantined=2),  # answered, not published
        I3: Observed(new_tuples=1),  # nothing waits, but its end is after the window's
    }
    records = evaluate("out", {}, observed, HOUR, I3, "r1", NOW)
    assert [(r.interval_start, r.tuples, r.complete) for r in records] == [
        (I0, 4, True),
        (I1, 3, False),
        (I2, 2, False),
        (I3, 1, False),
    ]
    first, second = records[0], records[1]
    assert (first.completed_at, first.completed_run_id, first.run_id) == (NOW, "r1", "r1")
    assert (second.waiting, second.oldest_waiting_entered_at) == (1, I1 + HOUR)
    assert (second.completed_at, second.completed_run_id) == (None, None)


def test_a_complete_interval_keeps_who_completed_it_unless_late_tuples_reopen_it() -> None:
    prior = {I0: record(I0, 4, True, "r1"), I1: record(I1, 3, False, "r1")}
    # Evaluated again by r2: I0 unchanged keeps r1's completion; I1 completes now.
    again = evaluate("out", prior, {I0: Observed(), I1: Observed()}, HOUR, I3, "r2", NOW)
    assert [(r.completed_run_id, r.completed_at, r.tuples) for r in again] == [
        ("r1", NOW - HOUR, 4),
        ("r2", NOW, 3),
    ]
    # A late tuple of I0 arrives: it waits (I0 is open again), then it is answered (I0
    # is complete anew, by the run that answered it).
    late = evaluate("out", prior, {I0: Observed(1, waiting=1)}, HOUR, I3, "r3", NOW)
    assert (late[0].tuples, late[0].complete, late[0].completed_run_id) == (5, False, None)
    answered = evaluate("out", {I0: late[0]}, {I0: Observed()}, HOUR, I3, "r4", NOW)
    assert (answered[0].tuples, answered[0].completed_run_id) == (5, "r4")
    # Answered in the run that brought it: complete anew too, by that run.
    same_run = evaluate("out", prior, {I0: Observed(1)}, HOUR, I3, "r5", NOW)
    assert (same_run[0].tuples, same_run[0].completed_run_id) == (5, "r5")


def test_window_intervals_and_the_chains_bound() -> None:
    assert window_intervals(I0, I2, HOUR) == [I0, I1]
    assert window_intervals(I0 + HOUR / 2, I2 + HOUR / 2, HOUR) == [I1]  # only whole ones
    assert window_intervals(I0, I0 + HOUR / 2, HOUR) == []
    config = chained_config(Path("/nonexistent"))
    assert [s.name for s in table_chain(config, "named")] == ["enrich", "name"]
    # SSBJ may hold a tuple 2 runs; the next stage answers it in the second of them.
    assert chain_bound(config, "named").intervals == 2
    assert chain_bound(config, "out").describe() == "2 intervals (2h)"


# ---------------------------------------------------------------------- live validates


def intervals(store: StateStore, table: str) -> dict[dt.datetime, IntervalRecord]:
    return {r.interval_start: r for r in store.interval_records(table)}


def validated(
    h: SsbjHarness | LateHarness, run_id: str, start: dt.datetime
) -> dict[dt.datetime, IntervalRecord]:
    """``enrich validate`` of run ``run_id`` over the interval from ``start`` (it must pass),
    then the completeness records of table ``out``."""
    assert h.context.execute("validate", run_id, start, start + HOUR) == 0
    return intervals(h.store, "out")


def test_ssbj_tuples_held_across_runs_leave_their_interval_incomplete_until_answered(
    spark: SparkSession, tmp_path: Path
) -> None:
    """k = 2 partitions, 1 step a run, a bound of 2 intervals: an interval's tuples are all
    answered by the second run; the first leaves it incomplete (and, 2024 being long past,
    overdue). A retried validate records the same rows."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left")
    h.load_master(MASTER, files=2)
    arrived = dt.datetime.now(dt.UTC).replace(microsecond=0)  # commit times are in ms
    h.arrive([(i, i % 6) for i in range(1, 11)])  # ten tuples of I0
    h.run("r1")
    assert h.context.execute("validate", "r1", I0, I1) == 0
    (first,) = intervals(h.store, "out").values()
    assert (first.interval_start, first.tuples, first.waiting, first.complete) == (
        I0,
        10,
        10,
        False,
    )
    assert first.oldest_waiting_entered_at is not None
    # It entered the stage when its bronze version was committed.
    assert arrived <= first.oldest_waiting_entered_at <= dt.datetime.now(dt.UTC)
    shown = completeness_status(h.config, h.store)["out"]
    assert shown["freshness_bound"] == "2 intervals (2h)"
    (view,) = shown["intervals"]
    assert (view["share_answered"], view["complete"], view["overdue"]) == (0.0, False, True)
    assert shown["oldest_waiting"] == {
        "interval_start": I0,
        "entered_at": first.oldest_waiting_entered_at,
    }
    extra = published_extra(h.config, h.store, "out", "r1", (I0, I1))
    assert (extra["complete"], extra["share_answered"], extra["waiting"]) == (False, 0.0, 10)
    assert extra["interval_start"] == I0.isoformat() and extra["completed_intervals"] == []
    assert completed_extra(h.store, "out", "r1") is None

    h.arrive([(20 + i, i % 6) for i in range(4)], at=I1 + dt.timedelta(minutes=5))
    h.run("r2")
    found = validated(h, "r2", I1)
    assert (found[I0].waiting, found[I0].complete, found[I0].completed_run_id) == (0, True, "r2")
    assert (found[I1].tuples, found[I1].waiting, found[I1].complete) == (4, 4, False)
    assert published_extra(h.config, h.store, "out", "r2", (I1, I2))["completed_intervals"] == [
        I0.isoformat()
    ]
    done = completed_extra(h.store, "out", "r2")
    assert done is not None
    assert [i["interval_start"] for i in done["intervals"]] == [I0.isoformat()]

    # A retry of r2's validate: the same rows, I0's completion included.
    assert h.context.execute("validate", "r2", I1, I2) == 0
    assert intervals(h.store, "out") == found

    h.run("r3")
    last = validated(h, "r3", I2)
    assert last[I0] == found[I0]  # completed by r2, untouched since
    assert (last[I1].complete, last[I1].completed_run_id) == (True, "r3")
    # The window's own interval, without a tuple, is complete too.
    assert (last[I2].tuples, last[I2].complete, last[I2].completed_run_id) == (0, True, "r3")
    assert completeness_status(h.config, h.store)["out"]["overdue"] == 0


def chained_config(root: Path) -> PipelineConfig:
    """Stream s -> SSBJ (k = 2, 1 step a run) joined to m -> out -> the plain join to sup
    on the supplier -> named."""
    return parse_config(
        tiny_pipeline(root, "k", "bigint")
        | {
            "masters": {
                "m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "supplier", "price"]},
                "sup": {"table": "masters/sup", "keys": ["skey"], "columns": ["skey", "sname"]},
            },
            "stages": [
                equi_stage(
                    join="left",
                    operator={"mode": "ssbj", "partitions": 2, "steps_per_run": 1},
                    freshness={"complete_within": "2 intervals"},
                ),
                {
                    "name": "name",
                    "kind": "equi",
                    "input": "out",
                    "master": "sup",
                    "join_on": {"supplier": "skey"},
                    "join": "left",
                    "output": "named",
                    "operator": {"mode": "baseline"},
                },
            ],
        }
    )


class Chained:
    """The chained pipeline over the embedded engine, its tables created and masters loaded."""

    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.config = chained_config(root)
        self.spark = spark
        self.engine: DeltaEngine = open_engine(spark, "embedded")
        self.store = StateStore(self.config.warehouse.resolved_state_store())
        self.runner = PipelineRunner(PipelineHandles(self.config, spark, self.engine, self.store))
        self.context = PipelineContext(self.config, spark, self.engine, self.store, self.runner)
        layout = WarehouseLayout.of(self.config)
        self.bronze = layout.bronze("s")
        self.engine.create_table(self.bronze, bronze_schema(self.config.streams["s"]))
        m = layout.master(self.config, "m")
        self.engine.create_table(m, MASTER_SCHEMA)
        self.engine.append(m, spark.createDataFrame(MASTER, MASTER_SCHEMA).repartition(2))
        sup_schema = T.StructType(
            [T.StructField("skey", T.LongType()), T.StructField("sname", T.StringType())]
        )
        sup = layout.master(self.config, "sup")
        self.engine.create_table(sup, sup_schema)
        self.engine.append(sup, spark.createDataFrame([(0, "a"), (1, "b")], sup_schema))
        self.batches = 0

    def arrive(self, ids: range) -> None:
        self.batches += 1
        rows: list[tuple[Any, ...]] = [
            (i, i % 6, I0.replace(tzinfo=None) + dt.timedelta(seconds=i), "f", self.batches)
            for i in ids
        ]
        frame = self.spark.createDataFrame(rows, bronze_schema(self.config.streams["s"]))
        self.engine.append(self.bronze, frame, AppTransaction("test", self.batches))

    def step(self, stage: str, run_id: str) -> None:
        self.runner.run_stage_step(self.config.stage(stage), run_id)


def test_a_chained_output_waits_for_its_upstream_state_and_unread_input(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``named`` reads ``out``: its interval waits while SSBJ holds the tuples upstream and
    while ``out``'s rows are not yet read by its stage; each tuple is counted once however
    many rows it has (a key with two suppliers gives two)."""
    p = Chained(spark, tmp_path)
    p.arrive(range(1, 7))
    p.step("enrich", "r1")  # one step of two: every tuple is still in H_S
    assert p.context.execute("validate", "r1", I0, I1) == 0
    out, named = intervals(p.store, "out")[I0], intervals(p.store, "named")[I0]
    assert (out.tuples, out.waiting, out.complete) == (6, 6, False)
    assert (named.tuples, named.waiting, named.complete) == (6, 6, False)

    p.step("enrich", "r2")  # the closing step answers them all into out; name has not run
    assert p.context.execute("validate", "r2", I1, I2) == 0
    out, named = intervals(p.store, "out")[I0], intervals(p.store, "named")[I0]
    assert (out.waiting, out.complete, out.completed_run_id) == (0, True, "r2")
    assert (named.waiting, named.complete) == (6, False)  # unread in silver/out
    assert named.oldest_waiting_entered_at is not None

    p.step("name", "r3")
    assert p.context.execute("validate", "r3", I2, I3) == 0
    named = intervals(p.store, "named")[I0]
    assert (named.tuples, named.waiting, named.complete, named.completed_run_id) == (
        6,
        0,
        True,
        "r3",
    )
    assert intervals(p.store, "out")[I0].completed_run_id == "r2"


def five_tuples_joined(spark: SparkSession, tmp_path: Path) -> SsbjHarness:
    """A left SSBJ stage (k = 2, two steps a run) whose run ``r1`` joined five tuples of
    interval I0 into silver, nothing validated yet."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 2, "left")
    h.load_master(MASTER, files=2)
    h.arrive([(i, i % 6) for i in range(1, 6)])
    h.run("r1")
    return h


def test_tuples_in_an_unresolved_quarantined_batch_are_not_published(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = five_tuples_joined(spark, tmp_path)
    with pytest.raises(ValidationFailedError):
        h.context.auditor.audit_run("r1", {"out": ["rejected by the test"]})
    held = validated(h, "r2", I0)[I0]  # nothing new to audit
    assert (held.tuples, held.waiting, held.quarantined, held.complete) == (5, 0, 5, False)
    (view,) = completeness_status(h.config, h.store)["out"]["intervals"]
    assert view["share_answered"] == 0.0
    h.context.auditor.resolve("out", "r1", publish=True)
    done = validated(h, "r3", I1)[I0]
    assert (done.quarantined, done.complete, done.completed_run_id) == (0, True, "r3")


def test_a_tuple_waiting_for_a_late_master_row_holds_its_interval_open(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The plain join with ``late_master``: a tuple whose key has no master row yet waits in
    the late table, its interval incomplete since the step that first found no row; the
    row lands, the next step answers it, and the interval is complete."""
    h = LateHarness(spark, tmp_path, "left", "1h")
    h.load_master(MASTER, files=1)
    h.arrive([(1, 1), (2, 77)])  # no master row has key 77
    started = dt.datetime.now(dt.UTC).replace(microsecond=0)
    h.step()
    waiting = validated(h, "r1", I0)[I0]
    assert (waiting.tuples, waiting.waiting, waiting.complete) == (2, 1, False)
    assert waiting.oldest_waiting_entered_at is not None
    assert started <= waiting.oldest_waiting_entered_at <= dt.datetime.now(dt.UTC)
    h.update_master([(77, 1, 5.0)], [])
    h.step()
    done = validated(h, "r2", I1)[I0]
    assert (done.waiting, done.complete, done.completed_run_id) == (0, True, "r2")


def test_a_backfill_records_the_completeness_of_the_intervals_it_replaced(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = five_tuples_joined(spark, tmp_path)
    # Answered into silver; no validate: nothing published, nothing recorded.
    assert I0 not in intervals(h.store, "out")
    assert h.context.execute("backfill", "b1", I0, I1) == 0
    done = intervals(h.store, "out")[I0]
    assert (done.tuples, done.waiting, done.complete, done.completed_run_id) == (5, 0, True, "b1")
