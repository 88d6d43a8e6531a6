"""Write, audit, publish: defects are caught and quarantined; clean batches publish once."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from common.errors import BackfillIncompleteError, ValidationFailedError
from common.rows import Rows
from joins.ssbj.step import pending_tuples
from pipeline.audit_intent import FAILED_EXPECTATIONS, RUN_ID
from pipeline.backfill import rejoin_interval
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset, kill_harness_at, row_multiset
from tests.pipeline.audit_harness import (
    FIRST_BATCH,
    SECOND_BATCH,
    arrive_and_run,
    copy_pipeline,
    defect_in,
    drop_tuple,
    duplicate_a_match,
    null_key,
    out_of_range_price,
    published_rows,
    quality_harness,
    quarantined_second_batch,
    staged_rows,
    stale_entry,
    validate,
)
from tests.pipeline.ssbj_harness import BASE_TIME, SsbjHarness

pytestmark = pytest.mark.slow

BASE_TIME_UTC = BASE_TIME.replace(tzinfo=dt.UTC)
ONE_HOUR = dt.timedelta(hours=1)


def failing_results(h: SsbjHarness, run_id: str) -> list[str]:
    results = DeltaTable(h.layout.quality_results()).to_pyarrow_table().to_pylist()
    return [
        f"{r['expectation']}({r['column']}) [{r['description']}]"
        for r in results
        if r["run_id"] == run_id and not r["success"]
    ]


DEFECTS: dict[str, tuple[str, Callable[[DataFrame], DataFrame], str]] = {
    "duplicate match": ("out", duplicate_a_match, "expect_compound_columns_to_be_unique"),
    # Tuple 13 has no master row: a left join must emit it unmatched.
    "dropped tuple": ("out", drop_tuple(13), "row conservation: a tuple vanished"),
    "null key": ("out", null_key(11), "expect_column_values_to_not_be_null(id)"),
    "out-of-range value": ("out", out_of_range_price, "expect_column_values_to_be_between(price)"),
    "stale pending tuple": ("state", stale_entry, "freshness: a tuple waited too long"),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_defect_is_caught_quarantined_and_reported(
    spark: SparkSession, tmp_path: Path, base: Path, defect: str
) -> None:
    copy_pipeline(base, tmp_path)
    h = quality_harness(spark, tmp_path)
    published_before = published_rows(h)
    assert published_before, "the clean first batch was published"
    table, inject, expected = DEFECTS[defect]
    path = h.layout.staged("out") if table == "out" else h.paths_of(table)
    h.arrive(SECOND_BATCH)
    with defect_in(h, path, inject):
        # A defect in the state table is written by the step's commit. A second step of
        # the same run (one more asked for, or a closing step the freshness bound makes
        # due) would go on from the state this process holds (the rows it meant to write,
        # pipeline/ssbj/warm.py) and expire the chunk the defect made stale, so the run
        # takes one step without closing and the audit sees the table as the defect left it.
        if table == "state":
            h.run("r2", steps=1, close=False)
        else:
            h.run("r2")

    with pytest.raises(ValidationFailedError, match=r"out \(\d+ rows\)") as failure:
        validate(h, "r2")
    assert expected in str(failure.value)

    # The published table is unchanged; the batch sits in quarantine with the failures.
    assert_same_multiset(published_rows(h), published_before)
    quarantined = h.engine.read(h.layout.quarantined_output("out")).collect()
    assert quarantined and {r[RUN_ID] for r in quarantined} == {"r2"}
    assert any(expected in f for f in quarantined[0][FAILED_EXPECTATIONS])
    staged_batch = row_multiset(staged_rows(h)) - row_multiset(published_before)
    assert len(quarantined) == sum(staged_batch.values())
    # Reported: the results table and the run metrics say so.
    assert any(expected in f for f in failing_results(h, "r2"))
    assert [u["run_id"] for u in h.context.auditor.unresolved()] == ["r2"]
    failed = [m for m in h.store.metrics("r2") if m.name == "batch_failed"]
    assert [m.value for m in failed] == [1.0]

    # A retry of the same run fails the same way and still publishes nothing.
    with pytest.raises(ValidationFailedError):
        validate(h, "r2")
    assert_same_multiset(published_rows(h), published_before)


def test_resolving_a_quarantined_batch_publishes_it_once(
    spark: SparkSession, tmp_path: Path, base: Path
) -> None:
    h = quarantined_second_batch(spark, base, tmp_path)
    with pytest.raises(ValidationFailedError):
        validate(h, "r2")
    assert h.context.auditor.resolve("out", "r2", publish=True) > 0
    assert h.context.auditor.resolve("out", "r2", publish=True) == 0
    assert h.context.auditor.unresolved() == []
    assert_same_multiset(published_rows(h), staged_rows(h))


def test_warn_only_suite_publishes_and_records_the_failure(
    spark: SparkSession, tmp_path: Path, base: Path
) -> None:
    h = quarantined_second_batch(spark, base, tmp_path, warn_only=True)
    assert validate(h, "r2") == 0
    assert_same_multiset(published_rows(h), staged_rows(h))
    assert any("be_between(price)" in f for f in failing_results(h, "r2"))


def test_config_checks_gate_a_table_that_names_no_suite(
    spark: SparkSession, tmp_path: Path, base: Path
) -> None:
    # quality.out declares value_ranges {price: [0, 1000]} and, here, no suite at all.
    h = quarantined_second_batch(spark, base, tmp_path, suites=())
    published_before = published_rows(h)
    with pytest.raises(ValidationFailedError, match=r"be_between\(price\)"):
        validate(h, "r2")
    assert_same_multiset(published_rows(h), published_before)
    assert any("be_between(price)" in f for f in failing_results(h, "r2"))


def test_clean_runs_publish_everything_exactly_once(spark: SparkSession, tmp_path: Path) -> None:
    # One step per run with k = 2: tuples stay pending across runs and audits.
    h = quality_harness(spark, tmp_path, steps=1)
    for run, batch in enumerate([FIRST_BATCH, SECOND_BATCH, [(21, 4), (22, 77), (23, 1)]]):
        arrive_and_run(h, batch, f"r{run}")
        assert validate(h, f"r{run}") == 0
    h.drain()
    assert validate(h, "drain") == 0
    assert validate(h, "drain") == 0  # a retry publishes nothing more
    assert_same_multiset(published_rows(h), staged_rows(h))
    oracle_columns = ["id", "k", "mk", "supplier", "price", "_version_m"]
    assert_same_multiset(
        h.engine.read(h.layout.published("out")).select(*oracle_columns), h.oracle("left")
    )
    assert h.context.auditor.unresolved() == []


def test_a_tuple_pending_at_the_last_audit_must_still_be_emitted(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Tuples still in H_S when a batch is audited are accounted for at the next audit.
    Tuple 3 (key 77: no master row) waits in H_S at r1's audit; the left join must emit
    it unmatched when it leaves H_S in r2. A step that loses it fails row conservation;
    rows of waiting tuples in a quarantined batch count as emitted."""
    h = quality_harness(spark, tmp_path, steps=1)
    arrive_and_run(h, FIRST_BATCH, "r1")
    assert validate(h, "r1") == 0
    stage = h.operator()
    state = stage.state_frame()
    assert state is not None
    assert 3 in {r["id"] for r in pending_tuples(Rows.of(state)).to_arrow().to_pylist()}

    h.arrive(SECOND_BATCH)
    with defect_in(h, h.layout.staged("out"), drop_tuple(3)):
        h.run("r2")
    with pytest.raises(ValidationFailedError, match="row conservation: a tuple vanished"):
        validate(h, "r2")

    # The second batch's tuples waited in H_S at r2's audit, and the rows they emitted in r2
    # sit in quarantine with that batch: r3 accounts for them there and publishes cleanly.
    arrive_and_run(h, [(21, 4)], "r3")
    assert validate(h, "r3") == 0


@pytest.mark.parametrize("crash_at", ["audit.before_publish", "audit.after_publish"])
def test_crash_between_validation_and_publish_publishes_once(
    spark: SparkSession, tmp_path: Path, crash_at: str
) -> None:
    kill_harness_at("tests.pipeline.audit_harness", tmp_path, crash_at, REPO_ROOT)

    # Not a retry of r1: the next interval stages more rows first, then validates. The
    # interrupted batch is published once, then the new one (never r1's rows twice).
    h = quality_harness(spark, tmp_path)
    arrive_and_run(h, SECOND_BATCH, "r2")
    assert validate(h, "r2") == 0
    assert validate(h, "r2") == 0
    assert_same_multiset(published_rows(h), staged_rows(h))
    appends = [
        c for c in DeltaTable(h.layout.published("out")).history() if c["operation"] == "WRITE"
    ]
    assert len(appends) == 2, appends


def backfill_first_hour(h: SsbjHarness, run_id: str) -> int:
    return h.context.execute("backfill", run_id, BASE_TIME_UTC, BASE_TIME_UTC + ONE_HOUR)


def test_backfill_beside_an_unaudited_live_batch(
    spark: SparkSession, tmp_path: Path, base: Path
) -> None:
    copy_pipeline(base, tmp_path)
    h = quality_harness(spark, tmp_path, steps=1)
    h.batches.append((FIRST_BATCH, h.engine.snapshot(h.master).version))
    # A live batch is staged but not yet audited when the backfill of its interval runs.
    arrive_and_run(h, SECOND_BATCH, "r2")
    assert backfill_first_hour(h, "bf") == 0
    assert validate(h, "r2") == 0
    arrive_and_run(h, [(21, 4), (22, 77)], "r3")  # late tuples of the same interval
    h.drain()
    assert validate(h, "r3") == 0
    oracle_columns = ["id", "k", "mk", "supplier", "price", "_version_m"]
    expected = h.oracle("left")
    assert_same_multiset(h.engine.read(h.layout.staged("out")).select(*oracle_columns), expected)
    assert_same_multiset(h.engine.read(h.layout.published("out")).select(*oracle_columns), expected)


def test_live_publish_waits_for_an_interrupted_backfill(
    spark: SparkSession, tmp_path: Path, base: Path
) -> None:
    copy_pipeline(base, tmp_path)
    h = quality_harness(spark, tmp_path)
    h.batches.append((FIRST_BATCH, h.engine.snapshot(h.master).version))
    arrive_and_run(h, SECOND_BATCH, "r2")
    # What a backfill killed after replacing silver, before its audit, leaves behind.
    h.context.auditor.begin_backfill("bf", BASE_TIME_UTC, BASE_TIME_UTC + ONE_HOUR)
    rejoin_interval(h.runner, BASE_TIME_UTC, BASE_TIME_UTC + ONE_HOUR, "bf")
    gold_before = published_rows(h)
    with pytest.raises(BackfillIncompleteError, match="Rerun `enrich backfill"):
        validate(h, "r2")
    assert_same_multiset(published_rows(h), gold_before)

    assert backfill_first_hour(h, "bf") == 0
    assert validate(h, "r2") == 0
    oracle_columns = ["id", "k", "mk", "supplier", "price", "_version_m"]
    assert_same_multiset(
        h.engine.read(h.layout.published("out")).select(*oracle_columns), h.oracle("left")
    )
