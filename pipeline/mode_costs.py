"""What an equi stage's recent steps cost in each mode, from the step metrics the runner
recorded (``warehouse.state_metrics``), for ``mode: auto``'s measured choice
(:func:`joins.ssbj.choice.measured_choice`).

A step is SSBJ's when its metrics count cache hits (every SSBJ step records them, the
plain join's never do). Only the latest :data:`RECENT_STEPS` steps of the stage count, so
the costs follow the stage's data; the ones older are read no more.
"""

from __future__ import annotations

from dataclasses import dataclass

from joins.ssbj.choice import EquiMode, ModeCost
from warehouse.state_store import StateStore

RECENT_STEPS = 64
_NAMES = ("step_seconds", "tuples_in", "cache_hits")


@dataclass(frozen=True)
class ModeCosts:
    """The recent steps' costs by mode, and the mode of the latest step."""

    ssbj: ModeCost | None
    plain: ModeCost | None
    last: EquiMode | None


def recent_mode_costs(store: StateStore, stage: str) -> ModeCosts:
    """The costs of ``stage``'s latest steps in each mode (None: no step of that mode)."""
    steps = store.recent_step_metrics(stage, _NAMES, limit=RECENT_STEPS * len(_NAMES))
    totals: dict[EquiMode, list[float]] = {}
    last: EquiMode | None = None
    for step in steps:  # newest first
        values = step.values
        if "step_seconds" not in values:
            continue
        mode: EquiMode = "ssbj" if "cache_hits" in values else "baseline"
        last = last or mode
        total = totals.setdefault(mode, [0.0, 0.0, 0.0])
        total[0] += 1
        total[1] += values.get("tuples_in", 0.0)
        total[2] += values["step_seconds"]

    def cost(mode: EquiMode) -> ModeCost | None:
        found = totals.get(mode)
        return None if found is None else ModeCost(int(found[0]), found[1], found[2])

    return ModeCosts(cost("ssbj"), cost("baseline"), last)
