"""The audit's state of each output table in the state store, and its intent.

The state (``operator_state`` under ``audit.<table>``) holds the last audited versions of
the table and of its stage's input, the pending tuples recorded at the last audit, the
last decision, the quarantined batches and a running backfill. An **intent** (the batch,
the decision and the state it will record) is saved before the publish commit and turned
into the state after it (:func:`record_intent`), so an interrupted audit is finished
exactly as decided. The state is saved with the pins of the versions it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import BackfillIncompleteError
from pipeline.audit_batch import QUARANTINED
from pipeline.layout import WarehouseLayout
from pipeline.pins import audit_holder, audit_pins
from warehouse.state_store import StateStore


@dataclass(frozen=True)
class LastDecision:
    """The last audit's decision of a table, as the state records it."""

    run_id: str
    batch: tuple[int, int]
    action: str
    failures: list[str]


@dataclass(frozen=True)
class AuditMarks:
    """What an audit reads of a table's state, parsed once: the versions audited last (of
    the output and of its stage's input), the version of ``pending_table`` holding the
    tuples pending then, and the last decision."""

    output_version: int
    input_version: int
    pending_version: int | None
    pending_table: str | None
    last: LastDecision | None

    @classmethod
    def of(cls, state: dict[str, Any]) -> AuditMarks:
        last = state.get("last")
        pending = state.get("pending_version")
        return cls(
            output_version=int(state["output_version"]),
            input_version=int(state["input_version"]),
            pending_version=None if pending is None else int(pending),
            pending_table=state.get("pending_table"),
            last=None
            if not last
            else LastDecision(
                last["run_id"],
                (int(last["batch"][0]), int(last["batch"][1])),
                last["action"],
                last["failures"],
            ),
        )


def load_state(store: StateStore, table: str) -> dict[str, Any]:
    """The audit state of ``table``: an empty one before its first audit."""
    return store.operator_state(f"audit.{table}") or {
        "output_version": 0,
        "input_version": 0,
        "quarantined": [],
        "last": None,
    }


def save_state(
    store: StateStore, layout: WarehouseLayout, table: str, state: dict[str, Any]
) -> None:
    """Save the audit state with the pins of the versions it (and an open intent) reads,
    in one transaction: never a saved state whose versions a vacuum could delete."""
    pins = audit_pins(layout, table, state)
    store.save_operator_state(f"audit.{table}", state, pins=(audit_holder(table), pins))


def require_no_backfill_running(table: str, state: dict[str, Any]) -> None:
    """Refuse to publish while a backfill recorded as running has not completed."""
    running = state.get("backfill_running")
    if running:
        raise BackfillIncompleteError(
            f"{table}: backfill {running['run_id']} of [{running['start']}, "
            f"{running['end']}) started but did not finish, so the interval may be "
            "replaced in silver but not yet in gold; nothing is published until it "
            f"completes. Rerun `enrich backfill --start {running['start']} --end "
            f"{running['end']}`."
        )


def record_intent(
    store: StateStore, layout: WarehouseLayout, table: str, state: dict[str, Any]
) -> None:
    """Turn the intent into the audit state, in one state-store transaction."""
    intent = state.pop("intent")
    record = intent["record"]
    batch = intent["batch"]
    if intent.get("interval"):
        state.pop("backfill_running", None)
    else:
        state.update(
            output_version=int(batch[1]),
            input_version=int(record["input_version"]),
            pending_version=record["pending_version"],
            pending_table=record.get("pending_table"),
        )
    state["last"] = {
        "run_id": intent["run_id"],
        "batch": list(batch),
        "action": intent["action"],
        "failures": intent["failures"],
    }
    if intent["action"] == QUARANTINED:
        state["quarantined"].append(
            {
                "run_id": intent["run_id"],
                "batch": list(batch),
                "failures": intent["failures"],
                "resolved": False,
            }
        )
    save_state(store, layout, table, state)
    quarantined = intent["action"] == QUARANTINED
    store.record_metrics(
        intent["run_id"],
        f"quality.{table}",
        int(batch[1]),
        {
            "rows_published": 0 if quarantined else intent["rows"],
            "rows_quarantined": intent["rows"] if quarantined else 0,
            "expectations_evaluated": intent["expectations_evaluated"],
            "expectations_failed": intent["expectations_failed"],
            "batch_failed": float(bool(intent["failures"])),
        },
    )
