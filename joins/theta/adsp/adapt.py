"""A-DSP across runs: when to change scheme, and what Alg. 4 and Alg. 5 compare.

- :func:`task_loads`: the bytes each task holds under a plan, read off the routing table:
  a bucket's bytes spread evenly over its routing slots, and each (bucket, slot) cell's
  share counts at every task it is routed to.
- :func:`scheme_change_reason`: the rule of Sec. 5.5: change scheme when the busiest
  task holds more than 80% of the per-task memory V, or less than 50% of it.
- :func:`task_ranges`: each task's share of R and of S as :class:`Ranges` in a plan-wide
  coordinate ``p = (bucket + u) / buckets``, so the tasks of an old and a new plan compare
  directly even when coverage-area bounds moved. Alg. 4 (task mapping) and Alg. 5
  (migration plan) in :mod:`joins.theta.adsp.migration` run on these.
- :func:`carry_lines`: start-point alignment (Sec. 4.2) applied to a plan: an area of the
  new plan over the same master buckets as an area of the old one, both with regular R
  lines only, gets R lines aligned on the old ones instead of an even split.

Invariant: a (bucket, slot) cell's master rows are in exactly the tasks its routing-table
row names, so loads, ranges and migrations are all exact at slot granularity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction

from joins.theta.adsp.migration import Ranges, TaskRanges, aligned_lines
from joins.theta.adsp.plan import TaskArea, ThetaPlan, routing_rows, slot_lines

HIGH_WATER, LOW_WATER = 0.8, 0.5


def task_loads(plan: ThetaPlan, slots: int) -> list[float]:
    loads = [0.0] * plan.tasks
    for side, histogram in (("master", plan.master), ("stream", plan.stream)):
        for bucket, _slot, tasks in routing_rows(plan, side, slots):
            share = histogram.bucket_bytes[bucket] / slots
            for task in tasks:
                loads[task] += share
    return loads


def scheme_change_reason(
    loads: Sequence[float],
    task_memory: float,
    high: float = HIGH_WATER,
    low: float = LOW_WATER,
) -> str | None:
    """Why the scheme must change, or None while the busiest task stays within bounds."""
    busiest = max(loads, default=0.0)
    if busiest > high * task_memory:
        return f"busiest task holds {busiest:.0f} B > {high:.0%} of V = {task_memory:.0f} B"
    if busiest < low * task_memory:
        return f"busiest task holds {busiest:.0f} B < {low:.0%} of V = {task_memory:.0f} B"
    return None


def _cell(bucket: int, slot: int, buckets: int, slots: int) -> Ranges:
    return Ranges.of(
        (
            Fraction(bucket * slots + slot, buckets * slots),
            Fraction(bucket * slots + slot + 1, buckets * slots),
        )
    )


def task_ranges(plan: ThetaPlan, slots: int) -> list[TaskRanges]:
    r_parts: list[list[tuple[Fraction, Fraction]]] = [[] for _ in range(plan.tasks)]
    s_parts: list[list[tuple[Fraction, Fraction]]] = [[] for _ in range(plan.tasks)]
    for side, histogram, parts in (
        ("master", plan.master, r_parts),
        ("stream", plan.stream, s_parts),
    ):
        buckets = len(histogram.bucket_bytes)
        for bucket, slot, tasks in routing_rows(plan, side, slots):
            (interval,) = _cell(bucket, slot, buckets, slots).intervals
            for task in tasks:
                parts[task].append(interval)
    return [TaskRanges(Ranges.of(*r), Ranges.of(*s)) for r, s in zip(r_parts, s_parts, strict=True)]


def _slot_line_ranges(lines_of_slots: Sequence[int], lines: int) -> list[Ranges]:
    slots = len(lines_of_slots)
    return [
        Ranges.of(
            *[
                (Fraction(t, slots), Fraction(t + 1, slots))
                for t, line in enumerate(lines_of_slots)
                if line == index
            ]
        )
        for index in range(lines)
    ]


def _regular_r(area: TaskArea) -> bool:
    return area.extra_side != "row"


def carry_lines(old: ThetaPlan, new: ThetaPlan, slots: int) -> ThetaPlan:
    """``new`` with R lines aligned on ``old``'s where an area keeps its master buckets."""
    by_rows = {(a.first_row, a.last_row): a for a in old.areas if _regular_r(a)}
    areas = []
    for area in new.areas:
        before = by_rows.get((area.first_row, area.last_row))
        if before is None or not _regular_r(area):
            areas.append(area)
        elif before.rows == area.rows:
            areas.append(dataclasses.replace(area, r_slot_lines=before.r_slot_lines))
        else:
            old_lines = before.r_slot_lines or tuple(slot_lines(before.r_line_weights, slots))
            aligned = aligned_lines(_slot_line_ranges(old_lines, before.rows), area.rows)
            midpoints = [Fraction(2 * t + 1, 2 * slots) for t in range(slots)]
            carried = tuple(
                next(i for i, line in enumerate(aligned) if line.contains(u)) for u in midpoints
            )
            areas.append(dataclasses.replace(area, r_slot_lines=carried))
    return dataclasses.replace(new, areas=tuple(areas))
