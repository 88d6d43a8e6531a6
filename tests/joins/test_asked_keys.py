"""The asked keys' row mask keeps exactly the rows whose every key is asked, by bitmap over
a near range and by Arrow's ``is_in`` otherwise."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from joins.asked_keys import AskedKeys, AskedValues


@settings(max_examples=150, deadline=None)
@given(
    asked=st.lists(st.integers(-50, 50), max_size=12),
    far=st.sampled_from([None, 2**40, -(2**62), 2**31 - 1]),
    rows=st.lists(st.one_of(st.none(), st.integers(-60, 60), st.just(2**62)), max_size=40),
    master_type=st.sampled_from([pa.int64(), pa.int32()]),
)
def test_asked_values_keep_a_row_exactly_when_its_key_is_asked(
    asked: list[int], far: int | None, rows: list[int | None], master_type: pa.DataType
) -> None:
    """The bitmap over a near range and Arrow's ``is_in`` over a far one keep the same
    rows: those whose key is asked, never a null or a value outside the range."""
    values = sorted(set(asked) | ({far} if far is not None else set()))
    if master_type == pa.int32():
        values = [v for v in values if -(2**31) <= v < 2**31]
        rows = [r if r is None or -(2**31) <= r < 2**31 else None for r in rows]
    two = AskedKeys(
        (
            AskedValues.of("a", pa.array(values, master_type)),
            AskedValues.of("b", pa.array(values, pa.int64())),
        )
    )
    table = pa.table({"a": pa.array(rows, master_type), "b": pa.array(rows[::-1], pa.int64())})
    kept = table.filter(two.row_mask(table)).to_pylist()
    expected = [
        {"a": a, "b": b}
        for a, b in zip(rows, rows[::-1], strict=True)
        if a in values and b in values
    ]
    assert kept == expected


def test_a_near_range_of_integers_is_tested_by_bitmap() -> None:
    near = AskedValues.of("k", pa.array([3, 9, 4000], pa.int64()))
    assert near.bitmap is not None and near.low == 3 and len(near.bitmap) == 3998
    assert AskedValues.of("k", pa.array([1, 2**40], pa.int64())).bitmap is None
    assert AskedValues.of("k", pa.array(["x"], pa.string())).bitmap is None
