"""The audit state as a frozen value (``pipeline/audit_state.py``): it reads and writes
exactly the JSON object the state store holds, and an audit's changes (an intent, its
recording, a backfill, a resolution) are new values. No Spark."""

from __future__ import annotations

import json
from typing import Any

import pytest

from common.errors import StateStoreError
from pipeline.audit_batch import PUBLISHED, QUARANTINED
from pipeline.audit_state import AuditIntent, AuditRecord, AuditState

STORED: dict[str, Any] = {
    "output_version": 4,
    "input_version": 7,
    "quarantined": [
        {"run_id": "r1", "batch": [1, 2], "failures": ["x"], "resolved": False},
        {
            "run_id": "r0",
            "batch": [0, 1],
            "failures": ["y"],
            "resolved": True,
            "resolution": "acknowledged",
        },
    ],
    "last": {"run_id": "r2", "batch": [2, 4], "action": PUBLISHED, "failures": []},
    "pending_version": 3,
    "pending_table": "/w/_operators/s/state",
    "future": {"kept": True},
    "intent": {
        "run_id": "r3",
        "batch": [4, 6],
        "action": QUARANTINED,
        "rows": 12,
        "failures": ["z"],
        "interval": None,
        "record": {"input_version": 9, "pending_version": 5, "pending_table": "/w/p"},
        "expectations_evaluated": 3,
        "expectations_failed": 1,
    },
}


def same_json(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a) == json.dumps(b)


def test_a_stored_audit_state_round_trips_exactly() -> None:
    state = AuditState.from_dict(json.loads(json.dumps(STORED)))
    assert same_json(state.to_dict(), STORED)
    assert state.intent is not None and state.intent.record.pending_version == 5
    assert [q.run_id for q in state.unresolved()] == ["r1"]
    assert same_json(
        AuditState.empty().to_dict(),
        {
            "output_version": 0,
            "input_version": 0,
            "quarantined": [],
            "last": None,
        },
    )


def test_recording_a_live_intent_advances_the_versions_and_keeps_the_quarantine() -> None:
    state = AuditState.from_dict(json.loads(json.dumps(STORED)))
    recorded = state.recorded()
    expected = {k: v for k, v in STORED.items() if k != "intent"}
    expected.update(output_version=6, input_version=9, pending_version=5, pending_table="/w/p")
    expected["last"] = {"run_id": "r3", "batch": [4, 6], "action": QUARANTINED, "failures": ["z"]}
    expected["quarantined"] = [
        *STORED["quarantined"],
        {"run_id": "r3", "batch": [4, 6], "failures": ["z"], "resolved": False},
    ]
    assert same_json(recorded.to_dict(), expected)
    assert same_json(state.to_dict(), STORED)  # the state read is unchanged
    assert recorded.recorded() is recorded  # no intent open: nothing to record


def test_a_backfill_intent_ends_the_backfill_and_leaves_the_live_versions() -> None:
    state = AuditState.empty().with_backfill_running("b1", "2026-01-01T00:00", "2026-01-02T00:00")
    assert state.backfill_running is not None and state.backfill_running.run_id == "b1"
    intent = AuditIntent(
        run_id="b1",
        batch=[0, 2],
        action=PUBLISHED,
        rows=5,
        failures=[],
        interval=["2026-01-01T00:00", "2026-01-02T00:00"],
        record=AuditRecord(),
        expectations_evaluated=0,
        expectations_failed=0,
        stored_keys=AuditIntent.KEYS,
    )
    with_intent = state.with_intent(intent)
    assert with_intent.to_dict()["intent"]["record"] == {}
    recorded = AuditState.from_dict(json.loads(json.dumps(with_intent.to_dict()))).recorded()
    assert recorded.backfill_running is None and recorded.intent is None
    assert (recorded.output_version, recorded.input_version) == (0, 0)
    assert recorded.last is not None and recorded.last.versions == (0, 2)
    assert "backfill_running" not in recorded.to_dict()


def test_resolving_marks_only_the_runs_unresolved_batches() -> None:
    state = AuditState.from_dict(json.loads(json.dumps(STORED)))
    resolved = state.resolved("r1", "published").resolved("r0", "published")
    by_run = {q.run_id: q for q in resolved.quarantined}
    assert (by_run["r1"].resolved, by_run["r1"].resolution) == (True, "published")
    assert by_run["r0"].resolution == "acknowledged"  # resolved before: kept as it was
    assert resolved.unresolved() == []
    with pytest.raises(AttributeError):
        state.output_version = 9  # type: ignore[misc]


def test_a_live_intent_without_its_input_version_is_refused_not_read_as_zero() -> None:
    raw = json.loads(json.dumps(STORED))
    del raw["intent"]["record"]["input_version"]
    with pytest.raises(StateStoreError, match="lacks input_version"):
        AuditState.from_dict(raw).recorded()
