"""An SSBJ stage keeps its freshness bound: the steps a run takes derive from it, and a run
closes with the steps that answer every tuple it makes due."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import SsbjHarness

MASTER = [(k, s, float(10 * k + s)) for k in range(1, 9) for s in range(1 + k % 3)]


@pytest.mark.parametrize("how", ["inner", "left"])
def test_the_default_bound_answers_every_tuple_in_its_own_run(
    spark: SparkSession, tmp_path: Path, how: str
) -> None:
    """k = 4 and no steps_per_run: the bound of one interval derives 4 steps a run, so
    nothing is pending after any run and each run's output equals the oracle so far."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 4, 1, how, within="1 interval")
    h.load_master(MASTER, files=4)
    for batch in ([(0, 1), (1, 2), (2, 2), (3, 99)], [(4, 3), (5, 8), (6, 1)]):
        h.arrive(batch)
        h.run()
        assert h.operator().pending_rows() == 0
        assert_same_multiset(h.output(), h.oracle(how))


def test_a_two_interval_bound_spreads_the_cycle_and_answers_by_the_second_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    """k = 4 over a bound of two intervals: 2 steps a run; a run's tuples may wait into the
    next run, and never beyond it."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 4, 1, "left", within="2 intervals")
    h.load_master(MASTER, files=4)
    first = [(0, 1), (1, 2), (2, 5), (3, 7)]
    h.arrive(first)
    h.run()
    assert h.operator().pending_rows() > 0  # half the cycle: some tuples wait
    h.arrive([(4, 3)])
    h.run()
    # Every tuple of the first run is answered by the end of the second.
    answered = {row[0] for row in h.output()}
    assert {t for t, _ in first} <= answered


def test_a_run_asked_for_fewer_steps_still_closes_what_the_bound_makes_due(
    spark: SparkSession, tmp_path: Path
) -> None:
    """`enrich stage --steps 1` on a one-interval bound: the run closes with the steps its
    tuples need, so nothing is left pending."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 4, 1, "left", within="1 interval")
    h.load_master(MASTER, files=4)
    h.arrive([(0, 1), (1, 2), (2, 5), (3, 99)])
    h.run("r1", steps=1)
    assert h.store.offset("enrich").step_seq == 4  # one asked for, three to close
    assert h.operator().pending_rows() == 0
    assert_same_multiset(h.output(), h.oracle("left"))


def test_a_run_under_a_memory_budget_closes_the_input_the_budget_held_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A budget too small for more than one input version a step: the run's scheduled
    steps leave input in the input table, and its closing steps admit and answer it, so
    under the bound of one interval nothing of the run's input is left."""
    h = SsbjHarness(
        spark, tmp_path, "ssbj", 2, 1, "left", operator={"memory_bytes": 300}, within="1 interval"
    )
    h.load_master(MASTER, files=2)
    for batch in ([(0, 1), (1, 2)], [(2, 3), (3, 99)], [(4, 5), (5, 8)], [(6, 1)]):
        h.arrive(batch)
    h.run("r1")
    state = h.operator().wiring.store.offset("enrich")
    assert state.step_seq > 2  # more than the 2 scheduled steps
    assert h.operator().pending_rows() == 0
    assert_same_multiset(h.output(), h.oracle("left"))
