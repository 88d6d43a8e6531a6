"""A-DSP scheme changes: task mapping (Alg. 4), start-point alignment (Sec. 4.2) and the
migration plan (Alg. 5, Equ. 15-17) of one coverage area.

Model. Inside a coverage area Alg. 3 spreads tuples over lines content-insensitively. Here
that choice is a fixed position ``u`` in [0, 1) per tuple (its routing slot over the slot
count), so what a line holds is a set of u-intervals, :class:`Ranges`, and what a task
holds is one R range and one S range (Tab. 4's h and s). A scheme's lines of one stream
partition [0, 1): every tuple lives in exactly one line. Volumes are measures of ranges
times the stream's size, so a plan's cost is exact, not estimated.

- :func:`task_mapping` is Alg. 4: every (old, new) pair scored by the overlap
  ``lambda = |h^R & s^R| * |R| + |h^S & s^S| * |S|``, taken greedily in descending order,
  each task at most once. Ties go to the lower (old, new) index, so it is deterministic.
- :func:`aligned_lines` is the start-point-alignment optimisation (Fig. 8(b)): kept lines
  keep their start and shrink to the new share; the cut-off pieces and removed lines fill
  the lines that are short. It moves exactly the data new or grown lines lack, which is the
  minimum any split can move, so it never moves more than an even split (Fig. 8(a)).
- :func:`migration_plan` is Alg. 5: for each new task, what it lacks (Equ. 15) is copied
  from old tasks that hold it (Equ. 16), and what it holds but no longer needs is deleted
  (Equ. 17). Invariant, checked by :func:`apply_plan`: after the plan every new task holds
  exactly its new ranges, and no range is copied twice into the same task.

Irregular schemes (adjustive line with P_delta extra cells) are tasks with their own R and
S ranges like any other, so the same functions cover Alg. 5's steps 1 and 3.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

Stream = Literal["R", "S"]
ZERO, ONE = Fraction(0), Fraction(1)


@dataclass(frozen=True)
class Ranges:
    """A union of half-open intervals [b, e) inside [0, 1), kept sorted and merged."""

    intervals: tuple[tuple[Fraction, Fraction], ...] = ()

    @classmethod
    def of(cls, *pairs: tuple[Fraction | int | float, Fraction | int | float]) -> Ranges:
        return cls._normalised((Fraction(b), Fraction(e)) for b, e in pairs)

    @classmethod
    def full(cls) -> Ranges:
        return cls(((ZERO, ONE),))

    @classmethod
    def _normalised(cls, pairs: Iterable[tuple[Fraction, Fraction]]) -> Ranges:
        merged: list[tuple[Fraction, Fraction]] = []
        for begin, end in sorted(p for p in pairs if p[0] < p[1]):
            if merged and begin <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((begin, end))
        return cls(tuple(merged))

    @property
    def measure(self) -> Fraction:
        return sum((e - b for b, e in self.intervals), ZERO)

    @property
    def start(self) -> Fraction:
        return self.intervals[0][0] if self.intervals else ONE

    def __bool__(self) -> bool:
        return bool(self.intervals)

    def __and__(self, other: Ranges) -> Ranges:
        pieces = []
        for b1, e1 in self.intervals:
            for b2, e2 in other.intervals:
                begin, end = max(b1, b2), min(e1, e2)
                if begin < end:
                    pieces.append((begin, end))
        return Ranges._normalised(pieces)

    def __or__(self, other: Ranges) -> Ranges:
        return Ranges._normalised([*self.intervals, *other.intervals])

    def __sub__(self, other: Ranges) -> Ranges:
        pieces = list(self.intervals)
        for b2, e2 in other.intervals:
            next_pieces = []
            for b1, e1 in pieces:
                if e2 <= b1 or b2 >= e1:
                    next_pieces.append((b1, e1))
                    continue
                if b1 < b2:
                    next_pieces.append((b1, b2))
                if e2 < e1:
                    next_pieces.append((e2, e1))
            pieces = next_pieces
        return Ranges._normalised(pieces)

    def contains(self, u: Fraction | float) -> bool:
        return any(b <= u < e for b, e in self.intervals)

    def take(self, amount: Fraction) -> tuple[Ranges, Ranges]:
        """Split into (the first ``amount`` of measure, the rest), in u order."""
        taken, rest, left = [], [], amount
        for begin, end in self.intervals:
            if left <= 0:
                rest.append((begin, end))
            elif end - begin <= left:
                taken.append((begin, end))
                left -= end - begin
            else:
                taken.append((begin, begin + left))
                rest.append((begin + left, end))
                left = ZERO
        return Ranges._normalised(taken), Ranges._normalised(rest)


@dataclass(frozen=True)
class TaskRanges:
    """What one task holds: its share of R and its share of S."""

    r: Ranges
    s: Ranges

    def of(self, stream: Stream) -> Ranges:
        return self.r if stream == "R" else self.s


def even_lines(count: int) -> tuple[Ranges, ...]:
    """The naive split of Fig. 8(a): ``count`` equal consecutive ranges."""
    if count < 1:
        raise ValueError(f"a stream needs at least one line, got {count}")
    return tuple(Ranges.of((Fraction(i, count), Fraction(i + 1, count))) for i in range(count))


def aligned_lines(old: Sequence[Ranges], count: int) -> tuple[Ranges, ...]:
    """Start-point alignment (Sec. 4.2, Fig. 8(b)): ``count`` lines of equal share.

    The first ``min(count, len(old))`` old lines keep their start point and keep at most the
    new share; what they shed and the lines that are dropped form a pool that tops up every
    line that is short (the added lines when scaling out), in order.
    """
    if count < 1:
        raise ValueError(f"a stream needs at least one line, got {count}")
    share = Fraction(1, count)
    kept, pool = [], Ranges()
    for index, line in enumerate(old):
        if index < count:
            head, tail = line.take(share)
            kept.append(head)
            pool = pool | tail
        else:
            pool = pool | line
    kept += [Ranges()] * (count - len(kept))
    lines = []
    for line in kept:
        top_up, pool = pool.take(share - line.measure)
        lines.append(line | top_up)
    if pool:  # only if ``old`` did not cover [0, 1) in equal measure; keep nothing behind
        lines[-1] = lines[-1] | pool
    return tuple(lines)


def matrix_tasks(rows: Sequence[Ranges], columns: Sequence[Ranges]) -> tuple[TaskRanges, ...]:
    """Tasks of a regular alpha x beta matrix, row-major: m_kl holds row k of R, column l of S."""
    return tuple(TaskRanges(row, column) for row in rows for column in columns)


def overlap(old: TaskRanges, new: TaskRanges, r_size: float, s_size: float) -> float:
    """lambda of Alg. 4, line 3."""
    return float((old.r & new.r).measure) * r_size + float((old.s & new.s).measure) * s_size


def task_mapping(
    old: Sequence[TaskRanges], new: Sequence[TaskRanges], r_size: float, s_size: float
) -> dict[int, int]:
    """Alg. 4: ``{new task: old task}``; new tasks left out start empty."""
    candidates = [
        (overlap(o, n, r_size, s_size), i, k) for i, o in enumerate(old) for k, n in enumerate(new)
    ]
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    mapping: dict[int, int] = {}
    used_old: set[int] = set()
    for score, i, k in candidates:
        if score <= 0 or i in used_old or k in mapping:
            continue
        mapping[k] = i
        used_old.add(i)
    return mapping


@dataclass(frozen=True)
class Copy:
    """``<m_ij, m_kl, nu>``: copy stream ``stream``'s range ``ranges`` from old task to new."""

    source: int
    target: int
    stream: Stream
    ranges: Ranges


@dataclass(frozen=True)
class Delete:
    """``<odot, m_kl, d>``: the task that becomes new task ``target`` drops ``ranges``."""

    target: int
    stream: Stream
    ranges: Ranges


@dataclass(frozen=True)
class MigrationPlan:
    mapping: dict[int, int]
    copies: tuple[Copy, ...]
    deletes: tuple[Delete, ...]

    def volume(self, r_size: float, s_size: float) -> float:
        """Data moved between tasks (what Fig. 8 counts), in the sizes' unit."""
        size = {"R": r_size, "S": s_size}
        return sum(float(c.ranges.measure) * size[c.stream] for c in self.copies)

    def moved(self, stream: Stream) -> Fraction:
        return sum((c.ranges.measure for c in self.copies if c.stream == stream), ZERO)


def migration_plan(
    old: Sequence[TaskRanges], new: Sequence[TaskRanges], mapping: dict[int, int]
) -> MigrationPlan:
    """Alg. 5: copies by Equ. 15-16, deletions by Equ. 17."""
    copies: list[Copy] = []
    deletes: list[Delete] = []
    empty = TaskRanges(Ranges(), Ranges())
    for k, target in enumerate(new):
        held = old[mapping[k]] if k in mapping else empty
        for stream in ("R", "S"):
            wanted, have = target.of(stream), held.of(stream)
            lacking = wanted - (wanted & have)  # Equ. 15
            # Sources in old-task order: the first task holding a range supplies it, which
            # for a regular matrix is its first column (R) or first row (S), as in Alg. 5.
            for source, holder in enumerate(old):
                if not lacking:
                    break
                piece = holder.of(stream) & lacking  # Equ. 16
                if piece:
                    copies.append(Copy(source, k, stream, piece))
                    lacking = lacking - piece
            if lacking:
                raise ValueError(
                    f"new task {k} needs {stream} range {lacking} that no old task holds"
                )
            dropped = have - (wanted & have)  # Equ. 17
            if dropped:
                deletes.append(Delete(k, stream, dropped))
    return MigrationPlan(dict(mapping), tuple(copies), tuple(deletes))


def apply_plan(
    old: Sequence[TaskRanges], new_count: int, plan: MigrationPlan
) -> tuple[TaskRanges, ...]:
    """What every new task holds after the plan runs (used to check a plan)."""
    result = []
    for k in range(new_count):
        held = old[plan.mapping[k]] if k in plan.mapping else TaskRanges(Ranges(), Ranges())
        r, s = held.r, held.s
        for d in plan.deletes:
            if d.target == k:
                r, s = (r - d.ranges, s) if d.stream == "R" else (r, s - d.ranges)
        for c in plan.copies:
            if c.target == k:
                r, s = (r | c.ranges, s) if c.stream == "R" else (r, s | c.ranges)
        result.append(TaskRanges(r, s))
    return tuple(result)
