"""The A-DSP layout's state in the state store: the plan that routed the master, its
statistics, which physical task plays each task of the plan, the versions it was built
from and the migrations so far (``pipeline.adsp_layout``).

Held under the key ``layout`` of the stage's operator state, as a frozen value parsed
once where a run reads it (:meth:`LayoutState.read`); a build or a migration saves a
new one, its migrations carried on. Round-trips exactly
(``common.stored_object``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from common.stored_object import Stored

STATE_KEY = "layout"


@dataclass(frozen=True)
class LayoutMigration(Stored):
    """One migration of the layout (Alg. 5), as recorded: fractions are in units of the
    master's size, replicas counted, so both may exceed 1."""

    run_id: str
    reason: str
    tasks_before: int
    tasks_after: int
    tasks_touched: int
    moved_fraction_of_master: float
    rebuild_fraction_of_master: float
    moved_master_bytes: float
    rows_rewritten: int

    KEYS: ClassVar[tuple[str, ...]] = (
        "run_id",
        "reason",
        "tasks_before",
        "tasks_after",
        "tasks_touched",
        "moved_fraction_of_master",
        "rebuild_fraction_of_master",
        "moved_master_bytes",
        "rows_rewritten",
    )


@dataclass(frozen=True)
class LayoutState(Stored):
    """The layout a theta stage keeps between runs."""

    plan: Mapping[str, Any]  # joins.theta.adsp.plan.plan_to_dict
    ranges: Sequence[Sequence[float] | None]  # the master's value ranges per key column
    instances: Sequence[int]  # the physical task playing each task of the plan
    master_version: int  # the master version the layout routes
    layout_version: int  # the layout table's version holding it
    scheme: str
    task_memory: float
    migrations: Sequence[LayoutMigration] = ()

    KEYS: ClassVar[tuple[str, ...]] = (
        "plan",
        "ranges",
        "instances",
        "master_version",
        "layout_version",
        "scheme",
        "task_memory",
        "migrations",
    )

    @classmethod
    def read(cls, operator_state: Mapping[str, Any] | None) -> LayoutState | None:
        """The layout held in a stage's operator state, None before the first build."""
        raw = (operator_state or {}).get(STATE_KEY)
        if raw is None:
            return None
        return cls._read(
            raw, migrations=tuple(LayoutMigration._read(m) for m in raw.get("migrations", []))
        )

    def in_operator_state(self, operator_state: Mapping[str, Any]) -> dict[str, Any]:
        """The stage's operator state with this layout in place of the one it held."""
        return {**operator_state, STATE_KEY: self.to_dict()}
