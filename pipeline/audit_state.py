"""The audit's state of each output table in the state store, and its intent.

The state (``operator_state`` under ``audit.<table>``) holds the last audited versions of
the table and of its stage's input, the pending tuples recorded at the last audit, the
last decision, the quarantined batches and a running backfill. An **intent** (the batch,
the decision and the state it will record) is saved before the publish commit and turned
into the state after it (:func:`record_intent`), so an interrupted audit is finished
exactly as decided. The state is saved with the pins of the versions it reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import BackfillIncompleteError, StateStoreError
from common.stored_object import Stored
from pipeline.audit_batch import QUARANTINED
from pipeline.layout import WarehouseLayout
from pipeline.pins import PinHolder, audit_pins
from warehouse.state_store import StateStore


@dataclass(frozen=True)
class AuditRecord(Stored):
    """What a live audit records of its stage's input and pending tuples (a backfill's
    audit records none: every field absent)."""

    input_version: int | None = None
    pending_version: int | None = None
    pending_table: str | None = None

    @classmethod
    def of(
        cls, input_version: int, pending_version: int | None, pending_table: str | None
    ) -> AuditRecord:
        return cls(
            input_version=input_version,
            pending_version=pending_version,
            pending_table=pending_table,
            stored_keys=("input_version", "pending_version", "pending_table"),
        )


@dataclass(frozen=True)
class AuditedBatch(Stored):
    """A batch of silver versions (after, to] an audit of ``run_id`` decided on, and the
    expectations it failed."""

    run_id: str
    batch: Sequence[int]
    failures: Sequence[str]

    @property
    def versions(self) -> tuple[int, int]:
        return int(self.batch[0]), int(self.batch[1])


@dataclass(frozen=True)
class AuditIntent(AuditedBatch):
    """A decided audit, saved before its publish commit: the batch, the decision and what
    the audit will record (:meth:`AuditState.recorded`)."""

    action: str
    rows: int
    interval: Sequence[str] | None  # a backfill's [start, end) (ISO), None for a live batch
    record: AuditRecord
    expectations_evaluated: int
    expectations_failed: int

    KEYS: ClassVar[tuple[str, ...]] = (
        "run_id",
        "batch",
        "action",
        "rows",
        "failures",
        "interval",
        "record",
        "expectations_evaluated",
        "expectations_failed",
    )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AuditIntent:
        return cls._read(raw, record=AuditRecord._read(raw.get("record") or {}))


@dataclass(frozen=True)
class LastDecision(AuditedBatch):
    """The last audit's decision of a table, as the state records it."""

    action: str


@dataclass(frozen=True)
class QuarantinedBatch(AuditedBatch):
    """A batch an audit quarantined, until someone resolves it."""

    resolved: bool = False
    resolution: str | None = None  # "published" or "acknowledged", once resolved


@dataclass(frozen=True)
class BackfillRunning(Stored):
    """A backfill that started and has not completed: nothing is published meanwhile."""

    run_id: str
    start: str
    end: str


@dataclass(frozen=True)
class AuditState(Stored):
    """The audit's state of one output table, parsed once where it is read
    (:func:`load_state`); an audit's changes are values (:meth:`with_intent`,
    :meth:`recorded`, :meth:`with_backfill_running`, :meth:`resolved`)."""

    output_version: int  # the silver version audited last
    input_version: int  # the stage input's version consumed at the last audit
    quarantined: Sequence[QuarantinedBatch]
    last: LastDecision | None
    pending_version: int | None = None  # the version of pending_table read at the last audit
    pending_table: str | None = None  # the table the stage's driver keeps pending tuples in
    backfill_running: BackfillRunning | None = None
    intent: AuditIntent | None = None

    KEYS: ClassVar[tuple[str, ...]] = ("output_version", "input_version", "quarantined", "last")

    @classmethod
    def empty(cls) -> AuditState:
        """The state before a table's first audit."""
        return cls(
            output_version=0, input_version=0, quarantined=(), last=None, stored_keys=cls.KEYS
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> AuditState:
        last, running, intent = raw.get("last"), raw.get("backfill_running"), raw.get("intent")
        return cls._read(
            raw,
            quarantined=tuple(QuarantinedBatch._read(q) for q in raw.get("quarantined", [])),
            last=LastDecision._read(last) if last else None,
            backfill_running=BackfillRunning._read(running) if running else None,
            intent=AuditIntent.from_dict(intent) if intent else None,
        )

    def with_backfill_running(self, run_id: str, start: str, end: str) -> AuditState:
        running = BackfillRunning(
            run_id=run_id, start=start, end=end, stored_keys=("run_id", "start", "end")
        )
        return self.updated(backfill_running=running)

    def with_intent(self, intent: AuditIntent) -> AuditState:
        return self.updated(intent=intent)

    def recorded(self) -> AuditState:
        """The open intent turned into the state: a live batch advances the audited
        versions and the pending tuples' version; a backfill's ends the backfill; either
        becomes the last decision, and a quarantined batch is kept until resolved."""
        intent = self.intent
        if intent is None:
            return self
        state = self.without("intent")
        if intent.interval:
            state = state.without("backfill_running")
        else:
            record = intent.record
            if record.input_version is None:
                raise StateStoreError(
                    f"the audit intent of run {intent.run_id} (batch {intent.versions}) is a "
                    f"live batch's but its record lacks input_version: {record.to_dict()!r}"
                )
            state = state.updated(
                output_version=intent.versions[1],
                input_version=record.input_version,
                pending_version=record.pending_version,
                pending_table=record.pending_table,
            )
        decision = LastDecision(
            run_id=intent.run_id,
            batch=list(intent.versions),
            action=intent.action,
            failures=intent.failures,
            stored_keys=("run_id", "batch", "action", "failures"),
        )
        state = state.updated(last=decision)
        if intent.action == QUARANTINED:
            batch = QuarantinedBatch(
                run_id=intent.run_id,
                batch=list(intent.versions),
                failures=intent.failures,
                resolved=False,
                stored_keys=("run_id", "batch", "failures", "resolved"),
            )
            state = state.updated(quarantined=(*state.quarantined, batch))
        return state

    def resolved(self, run_id: str, resolution: str) -> AuditState:
        """The quarantined batches of run ``run_id`` not resolved yet, resolved as
        ``resolution`` (one resolved already keeps its resolution)."""
        return self.updated(
            quarantined=tuple(
                q.updated(resolved=True, resolution=resolution)
                if q.run_id == run_id and not q.resolved
                else q
                for q in self.quarantined
            )
        )

    def unresolved(self) -> list[QuarantinedBatch]:
        return [q for q in self.quarantined if not q.resolved]


def load_state(store: StateStore, table: str) -> AuditState:
    """The audit state of ``table``: an empty one before its first audit."""
    raw = store.operator_state(f"audit.{table}")
    return AuditState.from_dict(raw) if raw else AuditState.empty()


def save_state(store: StateStore, layout: WarehouseLayout, table: str, state: AuditState) -> None:
    """Save the audit state with the pins of the versions it (and an open intent) reads,
    in one transaction: never a saved state whose versions a vacuum could delete."""
    stored = state.to_dict()
    pins = audit_pins(layout, table, stored)
    store.save_operator_state(f"audit.{table}", stored, pins=(PinHolder.AUDIT.of(table), pins))


def require_no_backfill_running(table: str, state: AuditState) -> None:
    """Refuse to publish while a backfill recorded as running has not completed."""
    running = state.backfill_running
    if running:
        raise BackfillIncompleteError(
            f"{table}: backfill {running.run_id} of [{running.start}, "
            f"{running.end}) started but did not finish, so the interval may be "
            "replaced in silver but not yet in gold; nothing is published until it "
            f"completes. Rerun `enrich backfill --start {running.start} --end "
            f"{running.end}`."
        )


def record_intent(
    store: StateStore, layout: WarehouseLayout, table: str, state: AuditState
) -> AuditState:
    """Turn the open intent into the audit state (:meth:`AuditState.recorded`), saved with
    its metrics in one state-store transaction; the state recorded."""
    intent = state.intent
    assert intent is not None, "record_intent: no intent is open"
    recorded = state.recorded()
    save_state(store, layout, table, recorded)
    quarantined = intent.action == QUARANTINED
    store.record_metrics(
        intent.run_id,
        f"quality.{table}",
        intent.versions[1],
        {
            "rows_published": 0 if quarantined else intent.rows,
            "rows_quarantined": intent.rows if quarantined else 0,
            "expectations_evaluated": intent.expectations_evaluated,
            "expectations_failed": intent.expectations_failed,
            "batch_failed": float(bool(intent.failures)),
        },
    )
    return recorded
