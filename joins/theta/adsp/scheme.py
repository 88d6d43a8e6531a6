"""A-DSP scheme generation for one coverage area (seeds/a-dsp_adaptive_theta_join.txt, Sec. 3.1).

A coverage area ca joins |ca^r| bytes of R with |ca^s| bytes of S; every task holds at most
V bytes (Exp. 6). Three ways to lay tasks over it:

- Square (Equ. 9): ``N = ⌈|ca^r|/V_h⌉ · ⌈|ca^s|/V_h⌉`` with V_h = V/2, a regular matrix;
- Dynamic: the regular matrix with power-of-two rows and columns (the Dynamic baseline);
- Varietal (Alg. 1, Equ. 10–13): a primary stream P is cut into P_γ divisions, the
  secondary D fills the remaining memory of each task; D's remainder D^L gets an adjustive
  line of only P_δ = ⌈|P| / (V − D^L)⌉ cells instead of a whole line of P_γ cells.

Invariants (property-tested): every task of a returned scheme respects V, and Alg. 1 never
uses more tasks than Equ. 9 (for P = R with P_γ = ⌈|R|/V_h⌉ the varietal count is bounded by
Equ. 9, and Alg. 1 takes the minimum over its four P_γ candidates).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Side = Literal["row", "column"]


@dataclass(frozen=True)
class VarietalScheme:
    """``<α, β, P_δ, +>`` over a primary stream cut into P_γ divisions.

    Rows carry R and columns carry S. The regular part has P_γ primary divisions times D_γ^f
    secondary lines, each task full (|P|/P_γ + (V − |P|/P_γ) bytes). The adjustive line holds
    the secondary's remainder D^L in each of its P_δ cells, and every primary tuple also
    goes to one of those cells, chosen independently of its division, so a cell holds about
    D^L + |P|/P_δ ≤ V bytes and each (R, S) pair still meets in exactly one task.
    """

    primary_is_r: bool
    primary_divisions: int  # P_γ
    secondary_lines: int  # D_γ^f
    extra_cells: int  # P_δ
    r_bytes: float
    s_bytes: float
    task_memory: float

    @property
    def rows(self) -> int:  # α
        return self.primary_divisions if self.primary_is_r else self.secondary_lines

    @property
    def columns(self) -> int:  # β
        return self.secondary_lines if self.primary_is_r else self.primary_divisions

    @property
    def extra_side(self) -> Side:  # +
        return "column" if self.primary_is_r else "row"

    @property
    def tasks(self) -> int:
        return self.primary_divisions * self.secondary_lines + self.extra_cells

    @property
    def primary_bytes(self) -> float:
        return self.r_bytes if self.primary_is_r else self.s_bytes

    @property
    def secondary_bytes(self) -> float:
        return self.s_bytes if self.primary_is_r else self.r_bytes

    @property
    def line_bytes(self) -> float:
        """Secondary bytes per regular line: the memory a task has left after its share of P."""
        return self.task_memory - self.primary_bytes / self.primary_divisions

    @property
    def leftover_bytes(self) -> float:  # D^L
        return max(0.0, self.secondary_bytes - self.secondary_lines * self.line_bytes)

    def task_loads(self) -> list[float]:
        """Expected bytes held by each task: regular cells, then the adjustive cells."""
        share = self.primary_bytes / self.primary_divisions
        regular_secondary = min(
            self.line_bytes, self.secondary_bytes / max(1, self.secondary_lines)
        )
        loads = [share + regular_secondary] * (self.primary_divisions * self.secondary_lines)
        if self.extra_cells:
            loads += [
                self.leftover_bytes + self.primary_bytes / self.extra_cells
            ] * self.extra_cells
        return loads


def square_tasks(r_bytes: float, s_bytes: float, task_memory: float) -> int:
    """Equ. 9."""
    half = task_memory / 2
    return max(1, math.ceil(r_bytes / half)) * max(1, math.ceil(s_bytes / half))


def dynamic_tasks(r_bytes: float, s_bytes: float, task_memory: float) -> int:
    """The Dynamic baseline: rows and columns rounded up to powers of two."""
    half = task_memory / 2

    def power_of_two(volume: float) -> int:
        return 1 << max(0, math.ceil(math.log2(max(1.0, volume / half))))

    return power_of_two(r_bytes) * power_of_two(s_bytes)


def varietal_scheme(r_bytes: float, s_bytes: float, task_memory: float) -> VarietalScheme:
    """Alg. 1: the varietal matrix with the fewest tasks over the four P_γ candidates."""
    if task_memory <= 0:
        raise ValueError(f"task memory V must be positive, got {task_memory}")
    if r_bytes < 0 or s_bytes < 0:
        raise ValueError(f"stream volumes must be >= 0, got |R|={r_bytes}, |S|={s_bytes}")
    half = task_memory / 2
    best: VarietalScheme | None = None
    for primary_is_r in (True, False):
        primary, secondary = (r_bytes, s_bytes) if primary_is_r else (s_bytes, r_bytes)
        for p_gamma in (math.ceil(primary / half), math.floor(primary / half)):
            scheme = _scheme_for(
                primary_is_r, primary, secondary, p_gamma, r_bytes, s_bytes, task_memory
            )
            if scheme is not None and (best is None or scheme.tasks < best.tasks):
                best = scheme
    if best is None:
        raise ValueError(
            f"no varietal scheme fits V={task_memory:g}: |R|={r_bytes:g}, |S|={s_bytes:g}"
        )
    return best


def _scheme_for(
    primary_is_r: bool,
    primary: float,
    secondary: float,
    p_gamma: int,
    r_bytes: float,
    s_bytes: float,
    task_memory: float,
) -> VarietalScheme | None:
    p_gamma = max(1, p_gamma)
    share = primary / p_gamma
    remaining = task_memory - share
    if remaining <= 0:
        return None
    d_regular = math.floor(secondary / remaining)  # D_γ^f
    leftover = secondary - d_regular * remaining  # D^L (Equ. 12)
    extra = 0
    if leftover > 1e-9 * max(1.0, secondary):
        extra = math.ceil(primary / (task_memory - leftover))  # P_δ (Equ. 12)
        extra = min(max(extra, 1), p_gamma)
    if d_regular == 0 and extra == 0:
        d_regular = 1  # an empty secondary still needs one line of tasks for the primary
    return VarietalScheme(primary_is_r, p_gamma, d_regular, extra, r_bytes, s_bytes, task_memory)
