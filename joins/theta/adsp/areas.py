"""A-DSP area dichotomy (Alg. 2, Equ. 14, Def. 5-6) over a compressed ordered tuple matrix.

The ordered tuple matrix C̃ is compressed to buckets: rows are equi-depth buckets of R's
ordering key (``row_bytes[i]``), columns those of S (``column_bytes[j]``). For a monotonic
predicate the candidate cells of row i are one contiguous column interval
``[first[i], last[i]]`` (empty when first > last), and the intervals move right as i grows:
a staircase band that bounds every result cell.

A coverage area is a run of consecutive rows, trimmed to its first and last row with
candidates, with the bounding column interval of their candidate cells. Area dichotomy
splits an area between two rows (Def. 5); a split is followed only if it lowers the task
count (Def. 6), and among the followed splits the one with the fewest tasks wins (Equ. 14).
Each area costs the tasks of its varietal matrix (Alg. 1) for its R and S bytes.

Invariants (property-tested): areas are row-disjoint and cover every row with candidates,
so every candidate cell lies in exactly one area; the scheme never uses more tasks than
the single area over the whole band.

Complexity: with n row buckets, O(n²) row ranges are memoised and each tries O(n) splits,
so O(n³) varietal evaluations (n = 64: ~260k, well under a second). Column bounds come from
an O(n²) table of running minima and maxima.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from joins.theta.adsp.scheme import VarietalScheme, varietal_scheme


@dataclass(frozen=True)
class CoverageArea:
    first_row: int
    last_row: int
    first_column: int
    last_column: int
    scheme: VarietalScheme

    @property
    def tasks(self) -> int:
        return self.scheme.tasks


def partition_areas(
    row_bytes: Sequence[float],
    column_bytes: Sequence[float],
    candidate_columns: Sequence[tuple[int, int]],
    task_memory: float,
) -> list[CoverageArea]:
    """Alg. 2: split the candidate band into coverage areas with the fewest tasks."""
    n = len(row_bytes)
    if len(candidate_columns) != n:
        raise ValueError(
            f"need a candidate interval per row: {n} rows, {len(candidate_columns)} intervals"
        )
    column_prefix = [0.0]
    for size in column_bytes:
        column_prefix.append(column_prefix[-1] + size)
    row_prefix = [0.0]
    for size in row_bytes:
        row_prefix.append(row_prefix[-1] + size)

    # For each row range: the first and last row that have candidates (rows without any
    # are never routed, so they cost nothing at the edges) and the bounding column interval.
    bounds: dict[tuple[int, int], tuple[int, int, int, int] | None] = {}
    for a in range(n):
        lo, hi, top, bottom = len(column_bytes), -1, -1, -1
        for b in range(a, n):
            first, last = candidate_columns[b]
            if first <= last:
                lo, hi = min(lo, first), max(hi, last)
                top = b if top < 0 else top
                bottom = b
            bounds[(a, b)] = (top, bottom, lo, hi) if lo <= hi else None

    @cache
    def scheme(a: int, b: int) -> VarietalScheme | None:
        found = bounds[(a, b)]
        if found is None:
            return None
        top, bottom, lo, hi = found
        r = row_prefix[bottom + 1] - row_prefix[top]
        s = column_prefix[hi + 1] - column_prefix[lo]
        return varietal_scheme(r, s, task_memory)

    def cost(a: int, b: int) -> int:
        found = scheme(a, b)
        return 0 if found is None else found.tasks

    @cache
    def best(a: int, b: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        whole = cost(a, b)
        choice: tuple[int, tuple[tuple[int, int], ...]] = (whole, ((a, b),) if whole else ())
        for split in range(a, b):
            if cost(a, split) + cost(split + 1, b) >= whole:
                continue  # Def. 6: this dichotomy does not pay off
            left, right = best(a, split), best(split + 1, b)
            total = left[0] + right[0]
            if total < choice[0]:
                choice = (total, left[1] + right[1])
        return choice

    if n == 0:
        return []
    _, ranges = best(0, n - 1)
    areas = []
    for a, b in ranges:
        found, box = scheme(a, b), bounds[(a, b)]
        assert found is not None and box is not None
        areas.append(CoverageArea(box[0], box[1], box[2], box[3], found))
    return areas
