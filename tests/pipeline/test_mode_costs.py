"""The costs ``auto`` weighs (``pipeline/mode_costs.py``), read from the step metrics a
real state store keeps: the latest 64 steps of the stage, by mode."""

from __future__ import annotations

from pipeline.mode_costs import RECENT_STEPS, recent_mode_costs
from warehouse.state_store import StateStore


def test_only_the_latest_steps_count_whatever_their_mode(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    # 40 SSBJ steps (three metrics each), then 60 plain-join steps (two each): the latest
    # 64 steps are the 60 plain ones and the last 4 SSBJ ones.
    for step in range(40):
        values = {"step_seconds": 2.0, "tuples_in": 10.0, "cache_hits": 1.0}
        store.record_metrics("a", "s", step, values)
    for step in range(40, 100):
        store.record_metrics("b", "s", step, {"step_seconds": 1.0, "tuples_in": 10.0})
    store.record_metrics("b", "other", 1, {"step_seconds": 50.0, "tuples_in": 1.0})
    costs = recent_mode_costs(store, "s")
    assert RECENT_STEPS == 64
    assert costs.plain is not None and costs.ssbj is not None
    assert (costs.plain.steps, costs.plain.tuples, costs.plain.seconds) == (60, 600.0, 60.0)
    assert (costs.ssbj.steps, costs.ssbj.tuples, costs.ssbj.seconds) == (4, 40.0, 8.0)
    assert costs.last == "baseline"
    empty = recent_mode_costs(store, "nothing")
    assert (empty.ssbj, empty.plain, empty.last) == (None, None, None)


def test_an_ssbj_step_s_seconds_leave_out_the_scan_copy_s_creation(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    # The first step spent 9 of its 10 seconds creating the scan copy; the next two none.
    store.record_metrics(
        "a",
        "s",
        1,
        {"step_seconds": 10.0, "tuples_in": 10.0, "cache_hits": 0.0, "scan_created_seconds": 9.0},
    )
    for step in (2, 3):
        values = {"step_seconds": 1.0, "tuples_in": 10.0, "cache_hits": 2.0}
        store.record_metrics("a", "s", step, values)
    costs = recent_mode_costs(store, "s")
    assert costs.ssbj is not None and costs.plain is None
    assert (costs.ssbj.steps, costs.ssbj.tuples, costs.ssbj.seconds) == (3, 30.0, 3.0)
