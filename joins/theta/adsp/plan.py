"""A-DSP planning: histograms, candidate band, coverage areas and routing tables.

The compressed ordered tuple matrix has master (R) buckets as rows and stream (S) buckets
as columns, both equi-depth over their ordering keys. A monotonic predicate maps the key
range of R bucket i to the S values that can match it (its *candidate function*), which
becomes the column interval of row i. Alg. 2 splits that band into coverage areas; each
area gets a varietal matrix (Alg. 1). Baselines reuse the same machinery with one area:
Square (Equ. 9) and Dynamic (powers of two) over the whole matrix.

Bucket j of a histogram with inner boundaries b_0 < ... < b_{B-2} holds the values in
(b_{j-1}, b_j]: ``bucket(v) = #{k : b_k < v}``, which Spark evaluates as a sum of
comparisons and Python as ``bisect_left``. Both sides use the same rule, so the candidate
intervals are a superset of the result cells: no result is lost.
"""

from __future__ import annotations

import dataclasses
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from joins.theta.adsp.areas import CoverageArea, partition_areas
from joins.theta.adsp.scheme import VarietalScheme, dynamic_tasks, square_tasks, varietal_scheme


@dataclass(frozen=True)
class Histogram:
    """Equi-depth buckets: inner boundaries and the bytes that fall in each bucket."""

    boundaries: tuple[float, ...]
    bucket_bytes: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.bucket_bytes) != len(self.boundaries) + 1:
            raise ValueError(
                f"{len(self.boundaries)} boundaries need {len(self.boundaries) + 1} buckets, "
                f"got {len(self.bucket_bytes)}"
            )

    def bucket(self, value: float) -> int:
        return bisect_left(self.boundaries, value)


@dataclass(frozen=True)
class ValueRange:
    """A closed interval of stream values (infinite ends allowed)."""

    low: float
    high: float


def candidate_columns(
    ranges: Sequence[ValueRange | None], stream: Histogram
) -> list[tuple[int, int]]:
    """Column interval of each R bucket: the S buckets that can hold a value in its range."""
    intervals = []
    for value_range in ranges:
        if value_range is None or value_range.low > value_range.high:
            intervals.append((1, 0))
            continue
        first = stream.bucket(value_range.low)
        last = stream.bucket(value_range.high)
        intervals.append((first, last))
    return intervals


@dataclass(frozen=True)
class TaskArea:
    """One coverage area: its bucket ranges and the task-matrix layout inside it."""

    first_row: int
    last_row: int
    first_column: int
    last_column: int
    rows: int  # R lines (regular)
    columns: int  # S lines (regular)
    extra_cells: int  # P_δ
    extra_side: str  # "row": R has an adjustive line; "column": S has one; "none"
    r_line_weights: tuple[float, ...]  # relative bytes per R line (regular..., adjustive)
    s_line_weights: tuple[float, ...]
    first_task: int
    r_slot_lines: tuple[int, ...] | None = None  # R line of each routing slot, if carried over

    @property
    def tasks(self) -> int:
        return self.rows * self.columns + self.extra_cells


@dataclass(frozen=True)
class ThetaPlan:
    scheme: str
    areas: tuple[TaskArea, ...]
    master: Histogram
    stream: Histogram

    @property
    def tasks(self) -> int:
        return sum(a.tasks for a in self.areas)

    def area_of_row(self, bucket: int) -> int:
        for index, area in enumerate(self.areas):
            if area.first_row <= bucket <= area.last_row:
                return index
        return -1

    def areas_of_column(self, bucket: int) -> list[int]:
        return [
            index
            for index, area in enumerate(self.areas)
            if area.first_column <= bucket <= area.last_column
        ]


def _layout(
    scheme: VarietalScheme,
) -> tuple[int, int, int, str, tuple[float, ...], tuple[float, ...]]:
    """Regular rows/columns, extra cells and line weights of a varietal scheme."""
    regular_secondary = [scheme.line_bytes] * scheme.secondary_lines
    if scheme.extra_cells:
        regular_secondary.append(scheme.leftover_bytes)
    primary = tuple([1.0] * scheme.primary_divisions)
    secondary = tuple(regular_secondary)
    rows, columns = scheme.primary_divisions, scheme.secondary_lines
    # R's divisions are the rows when R is primary: the extra cells then form a column.
    side, r_weights, s_weights = "column", primary, secondary
    if not scheme.primary_is_r:
        rows, columns = columns, rows
        side, r_weights, s_weights = "row", secondary, primary
    return (
        rows,
        columns,
        scheme.extra_cells,
        side if scheme.extra_cells else "none",
        r_weights,
        s_weights,
    )


def _regular(
    rows: int, columns: int
) -> tuple[int, int, int, str, tuple[float, ...], tuple[float, ...]]:
    return rows, columns, 0, "none", (1.0,) * rows, (1.0,) * columns


def plan_theta(
    master: Histogram,
    stream: Histogram,
    ranges: Sequence[ValueRange | None],
    task_memory: float,
    scheme: str = "adsp",
) -> ThetaPlan:
    """The task layout for one run: A-DSP areas, or a single Square/Dynamic matrix."""
    intervals = candidate_columns(ranges, stream)
    r_total, s_total = sum(master.bucket_bytes), sum(stream.bucket_bytes)
    rows_n, columns_n = len(master.bucket_bytes), len(stream.bucket_bytes)
    layouts: list[
        tuple[CoverageArea | None, tuple[int, int, int, str, tuple[float, ...], tuple[float, ...]]]
    ]
    if scheme == "adsp":
        found = partition_areas(master.bucket_bytes, stream.bucket_bytes, intervals, task_memory)
        layouts = [(area, _layout(area.scheme)) for area in found]
    elif scheme in ("square", "dynamic", "full"):
        half = task_memory / 2
        if scheme == "dynamic":
            total = dynamic_tasks(r_total, s_total, task_memory)
            rows = 1 << max(0, math.ceil(math.log2(max(1.0, r_total / half))))
            layout = _regular(rows, total // rows)
        elif scheme == "square":
            rows = max(1, math.ceil(r_total / half))
            layout = _regular(rows, square_tasks(r_total, s_total, task_memory) // rows)
        else:  # full 2-DSP varietal matrix over everything (non-monotonic predicates)
            layout = _layout(varietal_scheme(r_total, s_total, task_memory))
        layouts = [(None, layout)]
    else:
        raise ValueError(f"unknown theta scheme {scheme!r}; expected adsp, square, dynamic or full")
    areas: list[TaskArea] = []
    first_task = 0
    for area, (rows, columns, extra, side, r_weights, s_weights) in layouts:
        bounds = (
            (area.first_row, area.last_row, area.first_column, area.last_column)
            if area is not None
            else (0, rows_n - 1, 0, columns_n - 1)
        )
        task_area = TaskArea(*bounds, rows, columns, extra, side, r_weights, s_weights, first_task)
        areas.append(task_area)
        first_task += task_area.tasks
    return ThetaPlan(scheme, tuple(areas), master, stream)


def route_master_line(area: TaskArea, line: int, pick: int) -> list[int]:
    """Tasks an R tuple in R-line ``line`` of ``area`` goes to (``pick`` chooses among extras)."""
    base = area.first_task
    regular = area.rows * area.columns
    if area.extra_side == "row" and line == area.rows:  # R's adjustive line: all extra cells
        return [base + regular + t for t in range(area.extra_cells)]
    tasks = [base + line * area.columns + c for c in range(area.columns)]
    if area.extra_side == "column":  # S has the adjustive line; R (primary) joins one cell
        tasks.append(base + regular + pick % area.extra_cells)
    return tasks


def route_stream_line(area: TaskArea, line: int, pick: int) -> list[int]:
    """Tasks an S tuple in S-line ``line`` of ``area`` goes to."""
    base = area.first_task
    regular = area.rows * area.columns
    if area.extra_side == "column" and line == area.columns:  # S's adjustive line
        return [base + regular + t for t in range(area.extra_cells)]
    tasks = [base + r * area.columns + line for r in range(area.rows)]
    if area.extra_side == "row":
        tasks.append(base + regular + pick % area.extra_cells)
    return tasks


def slot_lines(weights: Sequence[float], slots: int) -> list[int]:
    total = sum(weights)
    cumulative, lines, running = [], [], 0.0
    for w in weights:
        running += w
        cumulative.append(running / total if total else 1.0)
    for slot in range(slots):
        point = (slot + 0.5) / slots
        lines.append(next((i for i, c in enumerate(cumulative) if point <= c), len(weights) - 1))
    return lines


def routing_rows(plan: ThetaPlan, side: str, slots: int) -> list[tuple[int, int, list[int]]]:
    """(bucket, slot, tasks) rows of the routing table for ``side`` in ("master", "stream").

    Slot ``t`` stands for the tuples whose position ``u`` (a hash of the row) lies in
    [t / slots, (t + 1) / slots). An area's R line per slot comes from ``r_slot_lines``
    when a scheme change carried its lines over (start-point alignment), else from the
    line weights.
    """
    rows = []
    if side == "master":
        for bucket in range(len(plan.master.bucket_bytes)):
            index = plan.area_of_row(bucket)
            if index < 0:
                continue
            area = plan.areas[index]
            lines = (
                list(area.r_slot_lines)
                if area.r_slot_lines
                else slot_lines(area.r_line_weights, slots)
            )
            for slot in range(slots):
                rows.append((bucket, slot, route_master_line(area, lines[slot], slot)))
        return rows
    for bucket in range(len(plan.stream.bucket_bytes)):
        for index in plan.areas_of_column(bucket):
            column_area: TaskArea = plan.areas[index]
            lines = slot_lines(column_area.s_line_weights, slots)
            for slot in range(slots):
                rows.append((bucket, slot, route_stream_line(column_area, lines[slot], slot)))
    merged: dict[tuple[int, int], list[int]] = {}
    for bucket, slot, tasks in rows:
        merged.setdefault((bucket, slot), []).extend(tasks)
    return [(b, s, t) for (b, s), t in merged.items()]


def plan_to_dict(plan: ThetaPlan) -> dict[str, Any]:
    """A JSON-able form of ``plan``, for the operator state between runs."""
    return dataclasses.asdict(plan)


def plan_from_dict(raw: dict[str, Any]) -> ThetaPlan:
    def histogram(h: dict[str, Any]) -> Histogram:
        return Histogram(tuple(h["boundaries"]), tuple(h["bucket_bytes"]))

    areas = []
    for a in raw["areas"]:
        fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in a.items()}
        areas.append(TaskArea(**fields))
    return ThetaPlan(
        raw["scheme"], tuple(areas), histogram(raw["master"]), histogram(raw["stream"])
    )
