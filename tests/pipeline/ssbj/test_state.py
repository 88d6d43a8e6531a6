"""The SSBJ controller state as typed fields (``pipeline/ssbj/state.py``) reads and writes
exactly the JSON object the state store holds: the same keys, values and key order, for
objects written by this release and by releases from before some of its keys existed. No
Spark."""

from __future__ import annotations

import json
from dataclasses import FrozenInstanceError
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import JoinError, StateStoreError
from pipeline.ssbj.state import STATE_LAYOUT, ControllerState, SavedPlan, StepOutcome, held_back

# A state as this release writes it after a few steps, with a plan open (the key order
# is the one the controller's assignments leave: the fresh state's keys, then the scan
# copy's at the first plan, routing and sketch at the first step, then its counts).
CURRENT: dict[str, Any] = {
    "layout": 2,
    "next_step": 7,
    "cycle_base": 0,
    "partitions": 2,
    "cache_version": 3,
    "switch_version": None,
    "chunks": {"6": 3},
    "chunk_rows": {"6": 4},
    "pending_rows": 4,
    "cache_rows": 12,
    "backfills": [
        {"start": "2026-01-01T00:00:00", "end": "2026-01-01T01:00:00", "input_version": 5}
    ],
    "sizes": {"stream": 24.0, "master": 40.5},
    "plan": {
        "step": 7,
        "at_us": 1_767_225_600_000_000,
        "late_wait_us": None,
        "input_from": 9,
        "input_to": 11,
        "backlog_rows": 0,
        "master_version": 3,
        "tables": {"state": 6},
        "scan": {"3": 2},
    },
    "scan": {"3": 2},
    "scan_partitions": 2,
    "routing": {"buckets": 4, "moved": {}, "split": {}},
    "key_sketch": {"phi": 2, "depth": 4, "width": 64},
    "counter_rows": 9,
    "late_rows": 0,
    "late_waiting": 0,
    "late_oldest_us": None,
    "late_min_version": None,
    "miss_rate": 0.25,
}

# A state of STATE_LAYOUT written before routing, key sketches, counter rows and late rows
# existed, with a plan from then (no step time, no wait).
EARLIER: dict[str, Any] = {
    "layout": 2,
    "next_step": 3,
    "cycle_base": 0,
    "partitions": 2,
    "cache_version": 1,
    "switch_version": 1,
    "chunks": {"2": 1},
    "chunk_rows": {"2": 5},
    "pending_rows": 5,
    "cache_rows": 0,
    "backfills": [],
    "sizes": None,
    "plan": {
        "step": 3,
        "input_from": 4,
        "input_to": 5,
        "backlog_rows": 0,
        "master_version": 1,
        "tables": {"state": 2},
        "scan": {"1": 1},
    },
    "scan": {"1": 1},
    "scan_partitions": 2,
    "miss_rate": 1.0,
}


def same_json(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal, with the keys in the same order at every level (the stored bytes)."""
    return json.dumps(a) == json.dumps(b)


@pytest.mark.parametrize("raw", [CURRENT, EARLIER], ids=["current", "earlier"])
def test_a_stored_state_round_trips_exactly(raw: dict[str, Any]) -> None:
    stored = json.loads(json.dumps(raw))
    state = ControllerState.from_dict(stored)
    assert state.to_dict() == raw
    assert same_json(state.to_dict(), raw)
    assert isinstance(state.plan, SavedPlan)


def test_keys_an_earlier_release_did_not_write_read_as_the_controller_assumed() -> None:
    state = ControllerState.from_dict(json.loads(json.dumps(EARLIER)))
    assert state.routing is None and state.key_sketch is None
    assert state.counter_rows == 0 and state.late_rows == 0 and state.late_waiting == 0
    assert state.late_oldest_us is None and state.late_min_version is None
    assert state.plan is not None
    assert state.plan.at_us is None and state.plan.late_wait_us is None
    assert state.tuple_sizes() is None
    without_miss_rate = {k: v for k, v in EARLIER.items() if k != "miss_rate"}
    assert ControllerState.from_dict(without_miss_rate).miss_rate == 1.0
    assert same_json(ControllerState.from_dict(without_miss_rate).to_dict(), without_miss_rate)


def test_unknown_keys_are_kept_where_they_were() -> None:
    raw = json.loads(json.dumps(CURRENT))
    raw = {"future": {"a": [1, 2]}, **raw}
    raw["plan"] = {**raw["plan"], "future_plan_key": 3}
    state = ControllerState.from_dict(raw)
    assert state.unknown == {"future": {"a": [1, 2]}}
    assert state.plan is not None and state.plan.unknown == {"future_plan_key": 3}
    later = state.updated(next_step=8)  # a change elsewhere leaves them as they were
    expected = {**raw, "next_step": 8}
    assert same_json(later.to_dict(), expected)
    assert same_json(state.to_dict(), raw)  # a value: the state read is unchanged


def _outcome(**changed: Any) -> StepOutcome:
    values: dict[str, Any] = {
        "partitions": 2,
        "entered_pending": 2,
        "tuples_seen": 4,
        "pending_rows": 2,
        "cache_rows": 0,
        "switch_rows": 0,
        "counter_rows": 1,
        "late_rows": 0,
        "late_waiting": 0,
        "late_oldest_us": None,
        "late_min_version": None,
        "cache_version": 1,
        "switch_version": 1,
        "replica_rows": False,
        "routing": None,
        "key_sketch": None,
        "segments": None,
    }
    return StepOutcome(**{**values, **changed})


def test_a_step_on_a_state_lacking_keys_appends_them_as_assigning_the_dict_did() -> None:
    """The completion of a step on a state from before the late rows: the keys the step
    sets are written, in the order the controller set them when it assigned to the dict
    (None included), and the state it started from is left as it was."""
    earlier = {k: v for k, v in EARLIER.items() if k != "miss_rate"}  # no input yet
    old_dict = json.loads(json.dumps(earlier))
    state = ControllerState.from_dict(json.loads(json.dumps(earlier)))
    assert state.plan is not None
    # What the controller did to the dict at the end of step 3 of k = 2 (chunk 2 expires).
    for key, value in [
        ("replica_rows", False),
        ("chunks", {"3": 1}),
        ("chunk_rows", {"3": 2}),
        ("cache_version", 1),
        ("switch_version", 1),
        ("pending_rows", 2),
        ("cache_rows", 0),
        ("switch_rows", 0),
        ("counter_rows", 1),
        ("late_rows", 0),
        ("late_waiting", 0),
        ("late_oldest_us", None),
        ("late_min_version", None),
        ("next_step", 4),
        ("plan", None),
        ("miss_rate", 0.5),
    ]:
        old_dict[key] = value
    after = state.after(state.plan, _outcome())
    assert same_json(after.to_dict(), old_dict)
    assert list(after.to_dict())[-6:] == [
        "counter_rows",
        "late_rows",
        "late_waiting",
        "late_oldest_us",
        "late_min_version",
        "miss_rate",
    ]
    assert same_json(state.to_dict(), earlier)


def test_a_controller_state_is_a_value() -> None:
    state = ControllerState.fresh(next_step=0, partitions=2)
    with pytest.raises(FrozenInstanceError):
        state.next_step = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="no stored field"):
        state.updated(nonsense=1)


@st.composite
def _steps(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    """k and a run of steps, each (tuples entering H_S, the master version)."""
    k = draw(st.integers(1, 5))
    steps = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=1, max_size=12))
    return k, steps


@given(_steps())
def test_after_a_step_h_s_holds_only_the_last_k_steps_chunks(
    run: tuple[int, list[tuple[int, int]]],
) -> None:
    """Algorithm 1's R-cycle: a chunk entered at step s expires at the end of step
    s + k - 1, so H_S never holds more than k chunks; each step advances the step count,
    closes its plan and leaves a state that round-trips through its JSON object."""
    k, steps = run
    state = ControllerState.fresh(next_step=0, partitions=k)
    for entered, version in steps:
        step = state.next_step
        plan = SavedPlan.new(step, 1, None, step, step + 1, 0, version, {})
        state = state.planned(plan, k)
        state = state.after(plan, _outcome(partitions=k, entered_pending=entered))
        assert state.next_step == step + 1 and state.plan is None
        assert set(state.chunks) == set(state.chunk_rows)
        assert all(step - k + 1 < int(entry) <= step for entry in state.chunks)
        assert len(state.chunks) <= k
        if entered and k > 1:  # with k = 1 a chunk expires at the step it entered
            assert state.chunks[str(step)] == version and state.chunk_rows[str(step)] == entered
        stored = json.loads(json.dumps(state.to_dict()))
        assert same_json(ControllerState.from_dict(stored).to_dict(), stored)


def test_a_state_of_the_earlier_layout_is_carried_on_only_when_nothing_waits() -> None:
    earlier = {"next_step": 9, "chunks": {}, "backfills": [{"start": "a"}], "scan": {"1": 0}}
    state = ControllerState.read(earlier, "s", next_step=0, partitions=3)
    assert state.layout == STATE_LAYOUT and state.next_step == 9 and state.cycle_base == 9
    assert state.backfills == [{"start": "a"}] and state.scan == {"1": 0}
    assert state.partitions == 3 and state.sizes is None
    with pytest.raises(JoinError, match="enrich drain"):
        ControllerState.read({**earlier, "chunks": {"8": 1}}, "s", next_step=0, partitions=3)
    assert ControllerState.read(None, "s", next_step=4, partitions=2).next_step == 4


def test_resuming_after_plain_join_steps_shifts_the_cycle_unless_something_waits() -> None:
    idle = ControllerState.from_dict({**CURRENT, "chunks": {}, "chunk_rows": {}, "plan": None})
    resumed = idle.resumed_at(10)
    assert (resumed.next_step, resumed.cycle_base) == (10, 3)
    assert idle.resumed_at(5) is idle
    busy = ControllerState.from_dict(CURRENT)
    assert busy.resumed_at(10) is busy


def test_changing_k_restarts_the_cycle_only_while_nothing_is_pending() -> None:
    idle = ControllerState.from_dict({**CURRENT, "chunks": {}, "chunk_rows": {}})
    assert (idle.repartitioned(4, "s").partitions, idle.repartitioned(4, "s").cycle_base) == (4, 7)
    with pytest.raises(JoinError, match=r"operator\.partitions changed from 2 to 4"):
        ControllerState.from_dict(CURRENT).repartitioned(4, "s")


def test_without_removes_a_key_as_pop_did() -> None:
    state = ControllerState.from_dict(json.loads(json.dumps(CURRENT)))
    state = state.without("key_sketch").without("routing")
    assert state.key_sketch is None and state.routing is None
    expected = {k: v for k, v in CURRENT.items() if k not in ("key_sketch", "routing")}
    assert same_json(state.to_dict(), expected)
    state = state.updated(routing={"buckets": 2, "moved": {}, "split": {}})  # back, at the end
    assert list(state.to_dict())[-1] == "routing"
    with pytest.raises(ValueError, match="always stored"):
        state.without("chunks")


def test_a_fresh_state_and_a_new_plan_have_the_keys_of_the_dicts_they_replace() -> None:
    state = ControllerState.fresh(next_step=5, partitions=3)
    assert same_json(
        state.to_dict(),
        {
            "layout": STATE_LAYOUT,
            "next_step": 5,
            "cycle_base": 5,
            "partitions": 3,
            "cache_version": None,
            "switch_version": None,
            "chunks": {},
            "chunk_rows": {},
            "pending_rows": 0,
            "cache_rows": 0,
            "backfills": [],
            "sizes": None,
            "plan": None,
        },
    )
    plan = SavedPlan.new(
        step=5,
        at_us=1,
        late_wait_us=None,
        input_from=0,
        input_to=2,
        backlog_rows=0,
        master_version=4,
        tables={},
    )
    plan = plan.updated(scan={"4": 1})
    state = state.planned(plan, 3)
    expected_plan = {
        "step": 5,
        "at_us": 1,
        "late_wait_us": None,
        "input_from": 0,
        "input_to": 2,
        "backlog_rows": 0,
        "master_version": 4,
        "tables": {},
        "scan": {"4": 1},
    }
    written = state.to_dict()
    assert same_json(written["plan"], expected_plan)
    assert list(written)[-2:] == ["scan", "scan_partitions"]
    assert same_json(ControllerState.from_dict(json.loads(json.dumps(written))).to_dict(), written)


def test_a_state_without_a_key_every_state_has_is_refused() -> None:
    broken = {k: v for k, v in EARLIER.items() if k != "chunks"}
    with pytest.raises(StateStoreError, match="lacks \\['chunks'\\]"):
        ControllerState.from_dict(broken)


def test_held_back_reads_stored_states_of_any_release() -> None:
    assert held_back(None) is None
    assert held_back(CURRENT) == "4 tuple(s) wait in H_S"
    assert held_back({**CURRENT, "chunks": {}}) == "its step 7 was planned and not completed"
    idle = {**CURRENT, "chunks": {}, "plan": None}
    assert held_back(idle) is None
    assert held_back({**idle, "late_rows": 2}) is not None
    assert held_back({"next_step": 7, "chunks": {"6": 1}}) == "0 tuple(s) wait in H_S"
