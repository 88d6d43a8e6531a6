"""``operator.late_master``: tuples wait for master rows that arrive after them, through the
runner, against a DuckDB oracle of the same rule, for the plain join and for SSBJ with one
partition (each step a whole R-cycle; ``tests/pipeline/ssbj/test_late.py`` has more).

The oracle: a tuple entering at step ``e`` is probed at every step from ``e`` until its wait
expires, each against that step's master version; it is answered from the first probed
version with rows of its key (those rows, that version); a tuple never answered emits one
unmatched row at expiry (left join) or nothing (inner join), and one not yet expired has no
rows yet.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from common.errors import ConfigError, ValidationFailedError
from pipeline.backfill import rejoin_interval
from pipeline.baseline_driver import EquiBaselineDriver
from pipeline.handles import PipelineHandles
from pipeline.late_table import late_table
from pipeline.runner import PipelineRunner
from pipeline.stage_config import SsbjParams
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset, kill_harness_at
from tests.pipeline.audit_harness import (
    arrive_and_run,
    defect_in,
    drop_tuple,
    published_rows,
    quality_harness,
    validate,
)
from tests.pipeline.late_harness import LateHarness, run_late_scenario
from tests.pipeline.ssbj_harness import BASE_TIME, SsbjHarness, config_for

MASTER = [(1, 0, 1.0), (1, 1, 1.5), (2, 0, 2.0)]


def add_master_rows(h: LateHarness, rows: list[tuple[int, int, float]]) -> None:
    h.update_master(rows, [])


MODES = ["baseline", "ssbj"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["left", "inner"])
def test_tuples_wait_for_late_master_rows_and_take_the_first_version_with_their_key(
    spark: SparkSession, tmp_path: Path, how: str, mode: str
) -> None:
    h = LateHarness(spark, tmp_path, how, "1h", mode)
    h.load_master(MASTER, files=1)
    h.arrive([(0, 1), (1, 2), (2, 3), (3, 4)])
    h.step()  # keys 3 and 4 have no rows: they wait
    assert h.waiting() == 2
    assert_same_multiset(h.output(), h.late_oracle())
    versions = h.late_versions()
    h.step()  # nothing new, the master as it was, no wait over: no step, no commit
    assert h.late_versions() == versions

    add_master_rows(h, [(3, 0, 3.0), (3, 1, 3.5), (1, 0, -1.0)])  # key 3 lands, key 1 changes
    h.arrive([(4, 3), (5, 5), (6, 1)])
    h.step()  # the waiting key-3 tuple and the new one are answered from this version
    assert h.waiting() == 2  # keys 4 and 5
    add_master_rows(h, [(4, 0, 4.0), (5, 0, 5.0)])
    h.step()  # no new input: the step still runs for the waiting tuples
    assert h.waiting() == 0
    h.step()  # nothing new and nothing waiting
    assert_same_multiset(h.output(), h.late_oracle())
    versions = {r[0]: r[5] for r in h.output()}
    assert versions[2] == versions[4] and versions[3] == versions[5] > versions[4]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["left", "inner"])
def test_a_tuple_whose_wait_expires_is_emitted_unmatched_or_dropped(
    spark: SparkSession, tmp_path: Path, how: str, mode: str
) -> None:
    """The wait is measured in time: a one-second wait has expired at a step two seconds
    later. Dropping ``late_master`` from the config expires every waiting tuple at the next
    step, so nothing is left behind in the late table."""
    h = LateHarness(spark, tmp_path, how, "1s", mode)
    h.load_master(MASTER, files=1)
    h.arrive([(0, 1), (1, 9)])
    h.step()
    assert h.waiting() == 1
    time.sleep(2.0)
    h.expired_at[1] = len(h.steps)
    h.step()  # tuple 1's wait is over
    assert h.waiting() == 0

    h.reconfigure("1h")
    h.arrive([(2, 9), (3, 2)])
    h.step()
    assert h.waiting() == 1
    h.reconfigure(None)  # the config no longer waits: the waiting tuple expires now
    h.step(expire=True)
    assert h.waiting() == 0
    assert_same_multiset(h.output(), h.late_oracle())


def test_late_master_config_and_auto_picks_the_plain_join(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for mode in ("ssbj", "meshjoin", "baseline"):
        SsbjParams.model_validate({"mode": mode, "late_master": {"wait": "1h"}})
    with pytest.raises(ValueError, match="longer than zero"):
        SsbjParams.model_validate({"late_master": {"wait": "0s"}})
    with pytest.raises(ConfigError, match="wait"):
        config_for(tmp_path, "baseline", 1, 1, "left", operator={"late_master": {}})
    h = SsbjHarness(spark, tmp_path, "auto", 1, 1, "left", operator={"late_master": {"wait": "1h"}})
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert type(h.runner.driver(h.config.stage("enrich"))) is EquiBaselineDriver
    assert "auto chose baseline: operator.late_master is set" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_the_audit_counts_waiting_tuples_as_pending_and_publishes_each_answer_once(
    spark: SparkSession, tmp_path: Path, mode: str
) -> None:
    """Write-audit-publish over a stage that waits for late master rows: a waiting tuple is
    one of the stage's pending tuples at each audit (the suite's conservation and freshness
    checks pass), its answer is published once when its key lands, and a step that loses a
    waiting tuple from the table that keeps it fails row conservation."""
    h = quality_harness(spark, tmp_path, mode=mode, operator={"late_master": {"wait": "1h"}})
    late = late_table(h.layout, "enrich")
    if mode == "ssbj":
        late = h.layout.operator_state("enrich", "state")
    arrive_and_run(h, [(1, 1), (2, 3), (3, 9), (4, 4)], "r1")  # keys 3 and 9: no rows yet
    assert validate(h, "r1") == 0
    kept = h.engine.read(late)
    column = "id" if mode == "baseline" else "s__id"
    assert {r[column] for r in kept.collect()} >= {2, 3}
    assert len({r[column] for r in kept.collect() if r[column] is not None}) == 2

    h.update_master([(9, 0, 90.0)], [])
    arrive_and_run(h, [(5, 2)], "r2")  # tuple 3 is answered from this master version
    assert validate(h, "r2") == 0
    published = published_rows(h)
    assert [r[:2] for r in published if r[0] == 3] == [(3, 9)]
    assert {r[0] for r in published} == {1, 3, 4, 5}  # tuple 2 still waits

    h.arrive([(6, 3)])
    with defect_in(h, late, drop_tuple(2, column)):
        h.run("r3")
    with pytest.raises(ValidationFailedError, match="row conservation: a tuple vanished"):
        validate(h, "r3")


@pytest.fixture(scope="module")
def uninterrupted(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, LateHarness]:
    """The late-master scenario run once per mode without a crash: what every killed run
    must end as."""
    references = {}
    for mode in MODES:
        reference = LateHarness(spark, tmp_path_factory.mktemp(mode), "left", "1h", mode)
        run_late_scenario(reference)
        assert reference.waiting() == 0
        assert_same_multiset(reference.output(), reference.late_oracle())
        references[mode] = reference
    return references


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "crash_at"),
    [
        # step 2: answers appended, the late table not rewritten
        ("baseline", "late.after_output:2"),
        # step 4, no new input: it emptied the late table, and is not recorded done (both
        # written, the step not recorded: the case of every step, here with the most undone)
        ("baseline", "stage.after_output_commit:4"),
        # SSBJ step 2 (the second run): output appended, the state with its late rows not.
        # (An SSBJ step killed with both written and not completed is
        # tests/pipeline/ssbj/test_crash.py's, in a scheduled run and in closing steps.)
        ("ssbj", "ssbj.after_output:2"),
    ],
)
def test_a_step_killed_between_its_commits_reruns_to_the_uninterrupted_result(
    spark: SparkSession,
    tmp_path: Path,
    uninterrupted: dict[str, LateHarness],
    mode: str,
    crash_at: str,
) -> None:
    kill_harness_at("tests.pipeline.late_harness", tmp_path, crash_at, REPO_ROOT, [mode])
    resumed = LateHarness(spark, tmp_path, "left", "1h", mode)
    run_late_scenario(resumed)
    assert resumed.waiting() == 0
    assert_same_multiset(resumed.output(), uninterrupted[mode].output())


def test_a_backfill_leaves_waiting_tuples_to_the_live_steps(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A backfill re-joins the interval without the tuples that still wait: a left join
    would otherwise emit them unmatched now and answered later."""
    h = LateHarness(spark, tmp_path, "left", "1h")
    h.load_master(MASTER, files=1)
    h.arrive([(0, 1), (1, 9), (2, 2)])
    h.step()
    start = BASE_TIME.replace(tzinfo=dt.UTC)
    rejoin_interval(h.runner, start, start + dt.timedelta(hours=1), "backfill")
    assert sorted(r[0] for r in h.output()) == [0, 0, 2]  # tuple 1 waits, not emitted
    add_master_rows(h, [(9, 0, 9.0)])
    h.step()
    assert_same_multiset(h.output(), h.late_oracle())
    assert h.waiting() == 0


def test_leaving_the_plain_join_while_tuples_wait_is_refused(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = LateHarness(spark, tmp_path, "left", "1h")
    h.load_master(MASTER, files=1)
    h.arrive([(0, 9)])
    h.step()
    ssbj = config_for(tmp_path, "ssbj", 2, 1, "left")
    runner = PipelineRunner(PipelineHandles(ssbj, spark, h.engine, h.store))
    with pytest.raises(ConfigError, match=r"stages\.enrich: .*1 tuple\(s\) wait in its late table"):
        runner.driver(ssbj.stage("enrich"))
    auto = config_for(tmp_path, "auto", 2, 1, "left", operator={"ssbj_above_bytes": 0})
    runner = PipelineRunner(PipelineHandles(auto, spark, h.engine, h.store))
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert type(runner.driver(auto.stage("enrich"))) is EquiBaselineDriver
    assert "still wait in its late table" in caplog.text


def test_waiting_ages_count_whole_intervals_waited(spark: SparkSession) -> None:
    from pyspark.sql import types as T

    from common.rows import Rows
    from pipeline.late_table import LATE_SINCE
    from pipeline.waiting_tuples import waiting_ages
    from tests.rows_check import rows_both_ways

    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    schema = T.StructType(
        [T.StructField("id", T.LongType()), T.StructField(LATE_SINCE, T.TimestampType())]
    )
    since = [now - dt.timedelta(minutes=m) for m in (0, 59, 60, 61, 185)]
    late = spark.createDataFrame([(i, t) for i, t in enumerate(since)], schema)
    wait, interval = dt.timedelta(hours=2), dt.timedelta(hours=1)
    ages = rows_both_ways(waiting_ages(Rows.of(late), "id", wait, interval, now), spark)
    assert [(r["tuple_id"], r["age_steps"], r["max_age_steps"]) for r in ages] == [
        (0, 0, 3),
        (1, 0, 3),
        (2, 1, 3),
        (3, 1, 3),
        (4, 3, 3),
    ]
