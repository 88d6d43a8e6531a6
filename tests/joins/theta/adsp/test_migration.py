"""Scheme changes: Alg. 4 task mapping, start-point alignment, Alg. 5 migration plans."""

from __future__ import annotations

from fractions import Fraction as Fr

from hypothesis import given, settings
from hypothesis import strategies as st

from joins.theta.adsp.migration import (
    Copy,
    Ranges,
    TaskRanges,
    aligned_lines,
    apply_plan,
    even_lines,
    matrix_tasks,
    migration_plan,
    task_mapping,
)

WHOLE = (Ranges.full(),)


def one_row(columns: tuple[Ranges, ...]) -> tuple[TaskRanges, ...]:
    """A 1 x n matrix, to count S migration only, as Fig. 8 does."""
    return matrix_tasks(WHOLE, columns)


def test_fig8a_even_split_with_alg4_mapping_moves_three_tenths() -> None:
    old, new = one_row(even_lines(4)), one_row(even_lines(5))
    mapping = task_mapping(old, new, r_size=0, s_size=1)
    assert mapping == {0: 0, 4: 3, 1: 1, 3: 2}  # s_2 = [2/5, 3/5] is the new task
    plan = migration_plan(old, new, mapping)
    assert plan.moved("S") == Fr(3, 10)
    assert {c.ranges for c in plan.copies if c.stream == "S" and c.target == 2} == {
        Ranges.of((Fr(2, 5), Fr(1, 2))),
        Ranges.of((Fr(1, 2), Fr(3, 5))),
    }


def test_fig8b_start_point_alignment_moves_one_fifth() -> None:
    quarters = even_lines(4)
    aligned = aligned_lines(quarters, 5)
    for i in range(4):  # s_i keeps h_i's start and 1/5 of the stream
        assert aligned[i] == Ranges.of((Fr(i, 4), Fr(i, 4) + Fr(1, 5)))
    assert aligned[4] == Ranges.of(*[(Fr(i, 4) + Fr(1, 5), Fr(i + 1, 4)) for i in range(4)])
    old, new = one_row(quarters), one_row(aligned)
    plan = migration_plan(old, new, task_mapping(old, new, 0, 1))
    assert plan.moved("S") == Fr(1, 5)
    assert sorted(c.ranges.measure for c in plan.copies if c.stream == "S") == [Fr(1, 20)] * 4


def test_fig9_two_by_two_to_two_by_three() -> None:
    old = matrix_tasks(even_lines(2), even_lines(2))
    new = matrix_tasks(even_lines(2), even_lines(3))
    mapping = task_mapping(old, new, r_size=1, s_size=1)
    # TP = {<m00, m00>, <m01, m02>, <m10, m10>, <m11, m12>}; m01 and m11 are new.
    m = {(k // 3, k % 3): (i // 2, i % 2) for k, i in mapping.items()}
    assert m == {(0, 0): (0, 0), (0, 2): (0, 1), (1, 0): (1, 0), (1, 2): (1, 1)}
    plan = migration_plan(old, new, mapping)
    into_m01 = {(c.source, c.stream, c.ranges) for c in plan.copies if c.target == 1}
    assert into_m01 == {
        (0, "R", Ranges.of((0, Fr(1, 2)))),  # s_01^R duplicated from m_00
        (0, "S", Ranges.of((Fr(1, 3), Fr(1, 2)))),  # from h_00^S
        (1, "S", Ranges.of((Fr(1, 2), Fr(2, 3)))),  # from h_01^S
    }
    into_m11 = {(c.source, c.stream, c.ranges) for c in plan.copies if c.target == 4}
    assert into_m11 == {
        (2, "R", Ranges.of((Fr(1, 2), 1))),
        (0, "S", Ranges.of((Fr(1, 3), Fr(1, 2)))),
        (1, "S", Ranges.of((Fr(1, 2), Fr(2, 3)))),
    }
    # Equ. 17: m_00 drops [1/3, 1/2) of S, the old m_01 (now m_02) drops [1/2, 2/3).
    drops = {(d.target, d.stream): d.ranges for d in plan.deletes}
    assert drops == {
        (0, "S"): Ranges.of((Fr(1, 3), Fr(1, 2))),
        (2, "S"): Ranges.of((Fr(1, 2), Fr(2, 3))),
        (3, "S"): Ranges.of((Fr(1, 3), Fr(1, 2))),
        (5, "S"): Ranges.of((Fr(1, 2), Fr(2, 3))),
    }
    assert apply_plan(old, len(new), plan) == new


def lines_of(old: tuple[Ranges, ...], count: int, aligned: bool) -> tuple[Ranges, ...]:
    return aligned_lines(old, count) if aligned else even_lines(count)


@settings(max_examples=150, deadline=None)
@given(
    old_rows=st.integers(1, 5),
    old_cols=st.integers(1, 5),
    new_rows=st.integers(1, 6),
    new_cols=st.integers(1, 6),
    r_size=st.integers(0, 50),
    s_size=st.integers(0, 50),
    aligned=st.booleans(),
)
def test_plans_move_exactly_what_the_new_scheme_needs(
    old_rows: int,
    old_cols: int,
    new_rows: int,
    new_cols: int,
    r_size: int,
    s_size: int,
    aligned: bool,
) -> None:
    old_r, old_s = even_lines(old_rows), even_lines(old_cols)
    new_r, new_s = lines_of(old_r, new_rows, aligned), lines_of(old_s, new_cols, aligned)
    for lines in (new_r, new_s):  # each tuple lives in exactly one line
        assert sum(line.measure for line in lines) == 1
        for a in range(len(lines)):
            for b in range(a + 1, len(lines)):
                assert not lines[a] & lines[b]
    old, new = matrix_tasks(old_r, old_s), matrix_tasks(new_r, new_s)
    mapping = task_mapping(old, new, r_size, s_size)
    assert len(set(mapping.values())) == len(mapping)  # each old task used at most once
    plan = migration_plan(old, new, mapping)
    assert apply_plan(old, len(new), plan) == new
    for k, task in enumerate(new):
        held = old[mapping[k]] if k in mapping else TaskRanges(Ranges(), Ranges())
        for stream in ("R", "S"):
            copied = [c.ranges for c in plan.copies if c.target == k and c.stream == stream]
            lacking = task.of(stream) - (task.of(stream) & held.of(stream))  # Equ. 15
            union = Ranges()
            for piece in copied:
                assert not piece & union, "a range is copied twice into one task"
                assert piece & lacking == piece, "a copy brings data the task has or needs not"
                union = union | piece
            assert union == lacking
            for copy in plan.copies:  # Equ. 16: copied from a task that holds it
                if copy.target == k and copy.stream == stream:
                    assert copy.ranges & old[copy.source].of(stream) == copy.ranges


@settings(max_examples=150, deadline=None)
@given(old_count=st.integers(1, 8), new_count=st.integers(1, 8))
def test_alignment_never_moves_more_than_an_even_split(old_count: int, new_count: int) -> None:
    old = one_row(even_lines(old_count))
    volumes = []
    for new_lines in (aligned_lines(even_lines(old_count), new_count), even_lines(new_count)):
        new = one_row(new_lines)
        volumes.append(migration_plan(old, new, task_mapping(old, new, 0, 1)).moved("S"))
    aligned, even = volumes
    assert aligned <= even
    # The minimum: what added lines need (out) or kept lines gain (in).
    assert aligned == abs(Fr(new_count - old_count, max(new_count, old_count)))


def test_ranges_arithmetic() -> None:
    a = Ranges.of((0, Fr(1, 2)), (Fr(3, 4), 1))
    b = Ranges.of((Fr(1, 4), Fr(7, 8)))
    assert (a & b) == Ranges.of((Fr(1, 4), Fr(1, 2)), (Fr(3, 4), Fr(7, 8)))
    assert (a - b) == Ranges.of((0, Fr(1, 4)), (Fr(7, 8), 1))
    assert (a | b) == Ranges.full()
    head, rest = a.take(Fr(5, 8))
    assert head == Ranges.of((0, Fr(1, 2)), (Fr(3, 4), Fr(7, 8))) and rest.measure == Fr(1, 8)
    assert Copy(0, 1, "S", a).ranges.contains(Fr(3, 4)) and not a.contains(Fr(1, 2))
