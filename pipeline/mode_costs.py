"""What an equi stage's recent steps cost in each mode, from the step metrics the runner
recorded (``warehouse.state_metrics``), for ``mode: auto``'s measured choice
(:func:`joins.ssbj.choice.measured_choice`).

A step is SSBJ's when its metrics count cache hits (every SSBJ step records them, the
plain join's never do). Only the latest :data:`RECENT_STEPS` steps of the stage count, so
the costs follow the stage's data; the ones older are read no more.

An SSBJ step's seconds leave out what it spent creating the operator's scan copy of the
master (``scan_created_seconds``: the first step, or the first after k changed): a setup
paid once, not a cost of the tuples, and one that grows with the master, the case SSBJ is
for. A sync to a later master version stays counted: the master's changes recur.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from joins.ssbj.choice import EquiMode, ModeCost
from warehouse.state_store import StateStore

RECENT_STEPS = 64
_NAMES = ("step_seconds", "tuples_in", "cache_hits", "scan_created_seconds")


@dataclass(frozen=True)
class ModeCosts:
    """The recent steps' costs by mode, and the mode of the latest step."""

    ssbj: ModeCost | None
    plain: ModeCost | None
    last: EquiMode | None


def recent_mode_costs(store: StateStore, stage: str) -> ModeCosts:
    """The costs of ``stage``'s latest steps in each mode (None: no step of that mode)."""
    # At most len(_NAMES) rows a step: enough rows for RECENT_STEPS steps, then cut to them
    # (a plain-join step records two of the names, an SSBJ step three or four, so the rows
    # hold more of them).
    rows = store.recent_step_metrics(stage, _NAMES, limit=RECENT_STEPS * len(_NAMES))
    steps = [step.values for step in rows if "step_seconds" in step.values][:RECENT_STEPS]
    costs: dict[EquiMode, ModeCost] = {}
    for values in steps:  # newest first
        mode = _mode_of(values)
        before = costs.get(mode, ModeCost(0, 0.0, 0.0))
        costs[mode] = ModeCost(
            before.steps + 1,
            before.tuples + values.get("tuples_in", 0.0),
            before.seconds + values["step_seconds"] - values.get("scan_created_seconds", 0.0),
        )
    last = _mode_of(steps[0]) if steps else None
    return ModeCosts(costs.get("ssbj"), costs.get("baseline"), last)


def _mode_of(values: Mapping[str, float]) -> EquiMode:
    return "ssbj" if "cache_hits" in values else "baseline"
