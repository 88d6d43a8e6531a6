"""The R-cycle state machine of SSBJ (Algorithm 1, lines 2–14).

An R-cycle is k consecutive steps, one per master partition. With steps numbered from 0,
step s belongs to cycle ``rc = s // k + 1`` (the paper increments rc at the start of every
cycle, from 0). The cycle's state is ``rc mod 3``:

- 1 incrementing: count master rows per pending join value (s_count);
- 2 switching: decide by the cache inequality which values move, collect their rows in the
  switching buffer over the whole cycle;
- 0 phase-out: at its first step, move the complete switching buffer into the cache.

Cache eviction runs at the first step of every cycle with ``rc mod E == 0`` (line 8, where
the paper fixes E = 10). E is ``operator.eviction_cycles``; the eviction inequality divides
f_count by the same E (line 45), because f_count is counted over the E cycles since the
last eviction pass. One parameter for both keeps them from disagreeing.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from joins.ssbj.cache.inequality import EVICTION_PERIOD_CYCLES


class CycleState(Enum):
    INCREMENTING = "incrementing"
    SWITCHING = "switching"
    PHASE_OUT = "phase-out"


@dataclass(frozen=True)
class StepPosition:
    """Where one step sits in the R-cycle machine."""

    step: int
    partitions: int
    eviction_cycles: int = EVICTION_PERIOD_CYCLES

    def __post_init__(self) -> None:
        if self.step < 0 or self.partitions < 1 or self.eviction_cycles < 1:
            raise ValueError(
                "need step >= 0, k >= 1 and an eviction period >= 1 cycle, got "
                f"step={self.step}, k={self.partitions}, period={self.eviction_cycles}"
            )

    @property
    def cycle(self) -> int:
        return self.step // self.partitions + 1

    @property
    def partition(self) -> int:
        """The master partition this step's disk phase reads."""
        return self.step % self.partitions

    @property
    def starts_cycle(self) -> bool:
        return self.partition == 0

    @property
    def state(self) -> CycleState:
        return {1: CycleState.INCREMENTING, 2: CycleState.SWITCHING, 0: CycleState.PHASE_OUT}[
            self.cycle % 3
        ]

    @property
    def evicts(self) -> bool:
        return self.starts_cycle and self.cycle % self.eviction_cycles == 0

    def expiring_entry_step(self) -> int | None:
        """Tuples that entered at this step have now met all k partitions after this step."""
        entry = self.step - self.partitions + 1
        return entry if entry >= 0 else None
