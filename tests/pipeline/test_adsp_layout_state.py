"""The A-DSP layout's stored state as a frozen value (``pipeline/adsp_layout_state.py``):
it reads and writes exactly the object the state store holds, keeps what else the
operator state holds, and a migration is appended to the record. No Spark."""

from __future__ import annotations

import json
from typing import Any

from pipeline.adsp_layout_state import STATE_KEY, LayoutMigration, LayoutState

SAVED: dict[str, Any] = {
    STATE_KEY: {
        "plan": {"tasks": 2, "anything": [1, 2]},
        "ranges": [None, [0.0, 9.5]],
        "instances": [0, 1],
        "master_version": 3,
        "layout_version": 4,
        "scheme": "adsp",
        "task_memory": 1024.0,
        "migrations": [
            {
                "run_id": "r1",
                "reason": "busiest task over 80% of V",
                "tasks_before": 1,
                "tasks_after": 2,
                "tasks_touched": 1,
                "moved_fraction_of_master": 0.5,
                "rebuild_fraction_of_master": 1.0,
                "moved_master_bytes": 512.0,
                "rows_rewritten": 10,
            }
        ],
    },
    "future": 1,
}


def test_a_saved_layout_round_trips_exactly_and_keeps_the_rest_of_the_state() -> None:
    raw = json.loads(json.dumps(SAVED))
    layout = LayoutState.read(raw)
    assert layout is not None
    assert (layout.master_version, layout.layout_version, layout.scheme) == (3, 4, "adsp")
    assert layout.migrations[0].tasks_after == 2
    assert json.dumps(layout.in_operator_state(raw)) == json.dumps(SAVED)
    assert LayoutState.read(None) is None and LayoutState.read({}) is None


def test_a_new_layout_carries_the_migrations_on() -> None:
    layout = LayoutState.read(json.loads(json.dumps(SAVED)))
    assert layout is not None
    moved = LayoutMigration(
        **{**SAVED[STATE_KEY]["migrations"][0], "run_id": "r2"}, stored_keys=LayoutMigration.KEYS
    )
    after = LayoutState(
        plan=layout.plan,
        ranges=layout.ranges,
        instances=[1, 0, 2],
        master_version=3,
        layout_version=5,
        scheme="adsp",
        task_memory=1024.0,
        migrations=(*layout.migrations, moved),
        stored_keys=LayoutState.KEYS,
    )
    stored = after.in_operator_state(SAVED)
    assert [m["run_id"] for m in stored[STATE_KEY]["migrations"]] == ["r1", "r2"]
    assert stored[STATE_KEY]["instances"] == [1, 0, 2] and stored["future"] == 1
    again = LayoutState.read(json.loads(json.dumps(stored)))
    assert again is not None and again.to_dict() == stored[STATE_KEY]
