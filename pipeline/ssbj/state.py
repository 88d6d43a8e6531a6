"""The SSBJ controller state: what a stage keeps in the state store between steps.

The state store holds it as one JSON object per stage (``StateStore.operator_state``);
:class:`ControllerState` is that object as typed fields, and :class:`SavedPlan` its
``plan``, the step fixed before the step writes anything. Both round-trip exactly:
``ControllerState.from_dict(d).to_dict() == d``, with the same keys in the same order,
so a warehouse written by an earlier release reads and writes as it did:

- a key the stored object lacks (written by a release from before it existed) reads as the
  default the controller always assumed for it, and stays absent until the controller
  assigns the field (assigning a field records it, as assigning a key of the dict did,
  and appends it after the stored keys); :meth:`Stored.drop` removes one, as ``pop`` did;
- a key this release does not know is kept, at its place, and written back unchanged.

Plain Python (no Spark), so it is unit-tested on its own.
"""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Self

from common.errors import JoinError
from joins.ssbj.cache.inequality import TupleSizes

# The operator-state layout this driver writes; state without it is from a release that
# kept H_S, H_R and the counters in separate tables.
STATE_LAYOUT = 2

_BOOKKEEPING = ("stored_keys", "unknown")


_FIELDS: dict[type, dict[str, Field[Any]]] = {}


def _fields_of(cls: type) -> dict[str, Field[Any]]:
    """The fields of a :class:`Stored` subclass that are keys of its JSON object."""
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = {f.name: f for f in fields(cls) if f.name not in _BOOKKEEPING}
    return found


@dataclass
class Stored:
    """A JSON object of the state store as typed fields (the subclasses' fields), keeping
    which keys the object holds, in their order, and the keys no field knows."""

    # The object's keys, in order: those read, then those assigned since.
    stored_keys: list[str] = field(default_factory=list, kw_only=True, repr=False, compare=False)
    # The values of keys this release does not know, written back as they were read.
    unknown: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tracking", True)  # assignments from here on are recorded

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if (
            self.__dict__.get("_tracking")
            and name in _fields_of(type(self))
            and name not in self.stored_keys
        ):
            self.stored_keys.append(name)

    def drop(self, name: str) -> None:
        """Remove the key ``name``; its field reads as its default again."""
        spec = _fields_of(type(self))[name]
        if spec.default_factory is not MISSING:
            object.__setattr__(self, name, spec.default_factory())
        elif spec.default is not MISSING:
            object.__setattr__(self, name, spec.default)
        else:
            raise ValueError(f"{type(self).__name__}.{name} is always stored")
        if name in self.stored_keys:
            self.stored_keys.remove(name)

    @classmethod
    def _read(cls, raw: dict[str, Any], **converted: Any) -> Self:
        known = _fields_of(cls)
        values = {k: v for k, v in raw.items() if k in known}
        values.update(converted)
        missing = [name for name, f in known.items() if name not in values and _required(f)]
        if missing:
            raise JoinError(
                f"SSBJ controller state: the stored {cls.__name__} lacks {missing}: {raw!r}"
            )
        return cls(
            **values,
            stored_keys=list(raw),
            unknown={k: v for k, v in raw.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, with the keys of :attr:`stored_keys` in their order."""
        out: dict[str, Any] = {}
        for key in self.stored_keys:
            value = self.unknown[key] if key in self.unknown else getattr(self, key)
            out[key] = value.to_dict() if isinstance(value, Stored) else value
        return out


def _required(spec: Field[Any]) -> bool:
    return spec.default is MISSING and spec.default_factory is MISSING


@dataclass
class SavedPlan(Stored):
    """One step's plan, saved in the controller state before the step writes anything: a
    rerun after a crash reads exactly these versions."""

    step: int  # the step number (the output's app transaction is step + 1)
    input_from: int  # the input version consumed before the step
    input_to: int  # the input version the step consumes to
    master_version: int  # the master version the step joins at
    tables: dict[str, int]  # operator table -> the version the step reads (once it exists)
    scan: dict[str, int] = field(default_factory=dict)  # master version -> scan copy version
    # The step's time and the stage's wait: late tuples are settled by them, and a rerun of
    # the step (even after a config edit) settles them alike. None in plans of releases
    # without late rows (then no late row is settled by the plan's time).
    at_us: int | None = None
    late_wait_us: int | None = None
    backlog_rows: int = 0  # input rows left for a later step by the memory budget

    # The order a new plan's keys are written in.
    KEYS: ClassVar[tuple[str, ...]] = (
        "step",
        "at_us",
        "late_wait_us",
        "input_from",
        "input_to",
        "backlog_rows",
        "master_version",
        "tables",
    )

    @classmethod
    def new(
        cls,
        step: int,
        at_us: int,
        late_wait_us: int | None,
        input_from: int,
        input_to: int,
        backlog_rows: int,
        master_version: int,
        tables: dict[str, int],
    ) -> SavedPlan:
        """A plan made now, its ``scan`` versions still to be assigned."""
        return cls(
            step=step,
            at_us=at_us,
            late_wait_us=late_wait_us,
            input_from=input_from,
            input_to=input_to,
            backlog_rows=backlog_rows,
            master_version=master_version,
            tables=tables,
            stored_keys=list(cls.KEYS),
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SavedPlan:
        return cls._read(raw)


@dataclass
class ControllerState(Stored):
    """Everything but the operator's tables that an SSBJ stage keeps between steps.

    The defaults are what the controller reads for a key the stored object lacks.
    """

    layout: int  # STATE_LAYOUT
    next_step: int  # the step the next step is
    cycle_base: int  # the step the R-cycle count starts at (StepPosition)
    partitions: int  # k the cycle runs with; changes only while nothing is pending
    cache_version: int | None  # the master version H_R is at (None: no cache)
    switch_version: int | None  # the master version the switching buffer s_B is at
    chunks: dict[str, int]  # entry step -> master version its H_S tuples are pinned to
    chunk_rows: dict[str, int] = field(default_factory=dict)  # entry step -> H_S tuples
    pending_rows: int = 0  # H_S after the last completed step
    cache_rows: int = 0  # H_R rows after the last completed step
    switch_rows: int = 0  # s_B's master rows after the last completed step
    # Intervals a backfill joined and published: {"start", "end" (ISO), "input_version"}.
    backfills: list[dict[str, Any]] = field(default_factory=list)
    sizes: dict[str, float] | None = None  # v_S and v_R, {"stream": B, "master": B}
    plan: SavedPlan | None = None  # the planned, not yet completed step
    scan: dict[str, int] = field(default_factory=dict)  # master version -> scan copy version
    scan_partitions: int | None = None  # the k the scan copy's versions in ``scan`` have
    routing: dict[str, Any] | None = None  # KeyRouting.to_dict of the next step
    key_sketch: dict[str, Any] | None = None  # ASketch.to_dict (key_counts: sketch)
    counter_rows: int = 0  # join values with counters after the last completed step
    late_rows: int = 0  # tuples waiting for late master rows, as late rows
    late_waiting: int = 0  # late rows and returned tuples in H_S
    late_oldest_us: int | None = None  # when the longest-waiting of them first met no row
    late_min_version: int | None = None  # the oldest version a late row met no row at
    miss_rate: float = 1.0  # the share of tuples that entered H_S in the last step
    # What the segmented state table holds, segment -> [rows, matched]
    # (``joins.ssbj.segments``); None when not known (the table is not segmented, or the
    # last step wrote it from Spark tasks), and the next step rewrites it whole.
    segments: dict[str, list[int]] | None = None
    # The state table may hold a value's counters and s_B mark more than once, one per
    # replica of a split key (the last step had split keys), or it is not known (a state
    # of an older release): the next step merges them (``StepPlan.one_row_per_value``).
    replica_rows: bool = True
    # The first step each of the stage's latest runs took, by run id, oldest first: which
    # pending tuples a run must answer before it ends (``pipeline.freshness.due_before``).
    run_starts: dict[str, int] = field(default_factory=dict)

    # The keys a fresh state is written with, in order.
    KEYS: ClassVar[tuple[str, ...]] = (
        "layout",
        "next_step",
        "cycle_base",
        "partitions",
        "cache_version",
        "switch_version",
        "chunks",
        "chunk_rows",
        "pending_rows",
        "cache_rows",
        "backfills",
        "sizes",
        "plan",
    )

    @classmethod
    def fresh(cls, next_step: int, partitions: int) -> ControllerState:
        """The state of a stage that has taken no step yet (numbered from ``next_step``)."""
        return cls(
            layout=STATE_LAYOUT,
            next_step=next_step,
            cycle_base=next_step,
            partitions=partitions,
            cache_version=None,
            switch_version=None,
            chunks={},
            stored_keys=list(cls.KEYS),
        )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ControllerState:
        """The state of ``STATE_LAYOUT`` as the state store returned it."""
        plan = raw.get("plan")
        if plan is None:
            return cls._read(raw)
        return cls._read(raw, plan=SavedPlan.from_dict(plan))

    def tuple_sizes(self) -> TupleSizes | None:
        """v_S and v_R as measured once per stage, or None before they are."""
        if self.sizes:
            return TupleSizes(self.sizes["stream"], self.sizes["master"])
        return None


def held_back(state: dict[str, Any] | None) -> str | None:
    """What the controller ``state`` (as stored, of any release) still holds that a later
    step must finish, or None: tuples waiting in H_S (their chunks), a step that was
    planned and not completed, or tuples waiting for late master rows.

    Such a stage must keep its SSBJ driver until a drain empties it (``pipeline.drivers``).
    """
    if not state:
        return None
    if state.get("chunks"):
        return f"{int(state.get('pending_rows', 0))} tuple(s) wait in H_S"
    if state.get("plan"):
        return f"its step {state.get('next_step')} was planned and not completed"
    if int(state.get("late_rows", 0)):
        return (
            f"{int(state['late_rows'])} tuple(s) wait for late master rows (they expire at "
            "the next step once operator.late_master is removed)"
        )
    return None
