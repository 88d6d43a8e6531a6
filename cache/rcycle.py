"""The R-cycle state machine of SSBJ (Algorithm 1, lines 2–14).

An R-cycle is k consecutive steps, one per master partition. With steps numbered from 0,
step s belongs to cycle ``rc = s // k + 1`` (the paper increments rc at the start of every
cycle, from 0). The cycle's state is ``rc mod 3``:

- 1 incrementing: count master rows per pending join value (s_count);
- 2 switching: decide by the cache inequality which values move, collect their rows in the
  switching buffer over the whole cycle;
- 0 phase-out: at its first step, move the complete switching buffer into the cache.

Cache eviction runs at the first step of every cycle with ``rc mod 10 == 0`` (line 8).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class CycleState(Enum):
    INCREMENTING = "incrementing"
    SWITCHING = "switching"
    PHASE_OUT = "phase-out"


@dataclass(frozen=True)
class StepPosition:
    """Where one step sits in the R-cycle machine."""

    step: int
    partitions: int

    def __post_init__(self) -> None:
        if self.step < 0 or self.partitions < 1:
            raise ValueError(
                f"need step >= 0 and k >= 1, got step={self.step}, k={self.partitions}"
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
        return self.starts_cycle and self.cycle % 10 == 0

    def expiring_entry_step(self) -> int | None:
        """Tuples that entered at this step have now met all k partitions after this step."""
        entry = self.step - self.partitions + 1
        return entry if entry >= 0 else None
