"""The segmented operator state table (``joins/ssbj/step.py``): each role's segment,
the chunks' fingerprints, and which segments a step rewrites."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.roles import CACHE, COUNTER, LATE, MARKED, PENDING, SWITCH
from joins.ssbj.step import (
    SEGMENT,
    changed_segments,
    prints_of,
    segment_column,
    with_segments,
)

SCHEMA = pa.schema(
    [
        ("_role", pa.string()),
        ("s__id", pa.int64()),
        ("r__mk", pa.int64()),
        ("_entry_step", pa.int64()),
        ("_matched", pa.bool_()),
        ("_hits", pa.int64()),
    ]
)


def state(rows: list[dict[str, Any]]) -> pa.Table:
    return with_segments(pa.Table.from_pylist(rows, schema=SCHEMA))


def pending(i: int, entry: int, matched: bool = False) -> dict[str, Any]:
    return {"_role": PENDING, "s__id": i, "_entry_step": entry, "_matched": matched}


def test_each_role_has_its_segment_and_a_pending_tuple_its_entry_step() -> None:
    rows = [
        pending(1, 7),
        pending(2, 9),
        {"_role": CACHE, "r__mk": 1},
        {"_role": COUNTER, "r__mk": 1, "_hits": 2},
        {"_role": MARKED, "r__mk": 3},
        {"_role": SWITCH, "r__mk": 3},
        {"_role": LATE, "s__id": 4},
    ]
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    assert segment_column(table).to_pylist() == [7, 9, -1, -2, -3, -5, -4]
    assert segment_column(table.slice(0, 0)).to_pylist() == []


def test_rows_that_are_not_state_and_pending_tuples_without_entry_step_are_refused() -> None:
    with pytest.raises(ValueError, match="roles \\['out'\\]"):
        segment_column(pa.Table.from_pylist([{"_role": "out"}], schema=SCHEMA))
    with pytest.raises(ValueError, match="no entry step"):
        segment_column(pa.Table.from_pylist([{"_role": PENDING, "s__id": 1}], schema=SCHEMA))


def test_prints_count_rows_and_matched_tuples_per_segment() -> None:
    table = state([pending(1, 3), pending(2, 3, True), pending(3, 4), {"_role": CACHE}])
    assert prints_of(table) == {3: (2, 1), 4: (1, 0), -1: (1, 0)}
    assert prints_of(state([])) == {}


@given(st.lists(st.tuples(st.integers(-5, 4), st.sampled_from([True, False, None])), max_size=40))
def test_prints_are_counted_in_any_row_order(rows: list[tuple[int, bool | None]]) -> None:
    """A segment's rows may come in several runs (a state written by Spark tasks): the
    prints add them up, as a count per segment over every row would."""
    table = pa.table(
        {
            SEGMENT: pa.array([s for s, _ in rows], pa.int64()),
            "_matched": pa.array([m for _, m in rows], pa.bool_()),
        }
    )
    expected: dict[int, tuple[int, int]] = {}
    for segment, matched in rows:
        n, m = expected.get(segment, (0, 0))
        expected[segment] = (n + 1, m + bool(matched))
    assert prints_of(table) == expected


def test_a_step_rewrites_the_new_chunk_removes_the_expired_and_leaves_the_others() -> None:
    before = state([pending(1, 3), pending(2, 4), pending(3, 5), {"_role": CACHE, "r__mk": 1}])
    after = state([pending(2, 4), pending(3, 5), pending(4, 6), {"_role": CACHE, "r__mk": 1}])
    write = changed_segments(after, prints_of(after), prints_of(before), before)
    assert write.segments == (3, 6)  # 3 expired (removed), 6 entered
    assert write.rows.column("s__id").to_pylist() == [4]
    assert set(write.rows.column(SEGMENT).to_pylist()) <= set(write.segments)


def test_a_chunk_whose_tuples_matched_or_left_is_rewritten() -> None:
    before = state([pending(1, 3), pending(2, 3), pending(3, 4)])
    matched = state([pending(1, 3, True), pending(2, 3), pending(3, 4)])
    assert changed_segments(matched, prints_of(matched), prints_of(before), before).segments == (3,)
    suppressed = state([pending(1, 3), pending(3, 4)])  # a backfill took tuple 2
    write = changed_segments(suppressed, prints_of(suppressed), prints_of(before), None)
    assert write.segments == (3,)
    assert write.rows.column("s__id").to_pylist() == [1]


def test_shared_segments_are_compared_with_the_rows_before_when_at_hand() -> None:
    before = state([{"_role": CACHE, "r__mk": 1}, {"_role": MARKED, "r__mk": 2}])
    same = state([{"_role": CACHE, "r__mk": 1}, {"_role": MARKED, "r__mk": 2}])
    other = state([{"_role": CACHE, "r__mk": 5}, {"_role": MARKED, "r__mk": 2}])
    prints = prints_of(before)
    assert changed_segments(same, prints_of(same), prints, before).segments == ()
    assert changed_segments(other, prints_of(other), prints, before).segments == (-1,)
    # Without the rows before, an equal count proves nothing: both are rewritten.
    assert changed_segments(same, prints_of(same), prints, None).segments == (-3, -1)


def test_counters_are_rewritten_when_they_changed() -> None:
    before = state([{"_role": COUNTER, "r__mk": 1, "_hits": 1}])
    same = state([{"_role": COUNTER, "r__mk": 1, "_hits": 1}])
    hit = state([{"_role": COUNTER, "r__mk": 1, "_hits": 2}])
    prints = prints_of(before)
    assert changed_segments(same, prints_of(same), prints, before).segments == ()
    assert changed_segments(hit, prints_of(hit), prints, before).segments == (-2,)
    empty = state([])
    assert changed_segments(empty, {}, {}, empty).segments == ()
