"""Applying an A-DSP migration plan to the persisted master layout, as DataFrames.

The layout holds every routed master row once per physical task (``_task``, a partition
column), with its histogram bucket and routing slot. A (bucket, slot) *cell* is the unit
the plan-wide ranges of :mod:`joins.theta.adsp.adapt` are made of, so the ranges of a migration
plan translate exactly into sets of cells.

:func:`migrated_rows` is a pure transform: the new content of the physical tasks the plan
touches (kept rows minus Equ. 17's deletions, plus Equ. 16's copies relabelled to their
target task), and the list of touched tasks. Written with one partition-replacing commit,
every other task's files stay as they are: only the ranges that need to move, move.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from joins.theta.adsp.join import BUCKET, SLOT, TASK
from joins.theta.adsp.migration import MigrationPlan, Ranges


def cells_of(ranges: Ranges, buckets: int, slots: int) -> list[int]:
    """Cell ids ``bucket * slots + slot`` covered by ``ranges`` (a union of whole cells)."""
    total = buckets * slots
    cells: list[int] = []
    for begin, end in ranges.intervals:
        first, stop = Fraction(begin) * total, Fraction(end) * total
        if first.denominator != 1 or stop.denominator != 1:
            raise ValueError(f"range [{begin}, {end}) does not fall on cell boundaries of {total}")
        cells.extend(range(int(first), int(stop)))
    return cells


def _cell(slots: int) -> Column:
    return F.col(BUCKET) * F.lit(slots) + F.col(SLOT)


def migrated_rows(
    layout: DataFrame,
    plan: MigrationPlan,
    old_instances: Sequence[int],
    new_instances: Sequence[int],
    buckets: int,
    slots: int,
) -> tuple[DataFrame, list[int]]:
    """New rows of the touched physical tasks, and those tasks (including removed ones)."""
    cell = _cell(slots)
    frames: list[DataFrame] = []
    touched: set[int] = set()
    for k, instance in enumerate(new_instances):
        deletes = [d for d in plan.deletes if d.target == k and d.stream == "R"]
        copies = [c for c in plan.copies if c.target == k and c.stream == "R"]
        if not deletes and not copies:
            continue
        touched.add(instance)
        if k in plan.mapping:
            held = layout.where(F.col(TASK) == old_instances[plan.mapping[k]])
            dropped = [c for d in deletes for c in cells_of(d.ranges, buckets, slots)]
            if dropped:
                held = held.where(~cell.isin(dropped))
            frames.append(held.withColumn(TASK, F.lit(instance)))
        for copy in copies:
            source = layout.where(
                (F.col(TASK) == old_instances[copy.source])
                & cell.isin(cells_of(copy.ranges, buckets, slots))
            )
            frames.append(source.withColumn(TASK, F.lit(instance)))
    touched |= set(old_instances) - set(new_instances)
    rows = layout.limit(0)
    for frame in frames:
        rows = rows.unionByName(frame.select(*layout.columns))
    return rows, sorted(touched)
