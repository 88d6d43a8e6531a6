"""The embedded engine's split of an Arrow write by partition values (no Spark)."""

from __future__ import annotations

import math
from collections import Counter

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from warehouse.delta.embedded_writes import partition_groups


def _rows(table: pa.Table) -> Counter[tuple]:
    return Counter(
        tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row.values())
        for row in table.to_pylist()
    )


@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.sampled_from(["2024-01-01", "2024-01-02"])),
            st.one_of(st.none(), st.sampled_from([1.0, 2.0, float("nan")])),
            st.integers(0, 1000),
        ),
        max_size=40,
    ),
    st.sampled_from([["day"], ["day", "score"], []]),
)
def test_every_row_lands_in_exactly_the_group_of_its_values(
    rows: list[tuple], partitions: list[str]
) -> None:
    table = pa.table(
        {
            "day": pa.array([r[0] for r in rows], pa.string()),
            "score": pa.array([r[1] for r in rows], pa.float64()),
            "value": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    groups = partition_groups(table, partitions)
    if not rows:
        assert groups == []
        return
    together = pa.concat_tables([g for _, g in groups])
    assert _rows(together) == _rows(table)
    seen = []
    for key, group in groups:
        assert list(key) == partitions
        for column in partitions:
            values = group.column(column).to_pylist()
            wanted = key[column]
            if isinstance(wanted, float) and math.isnan(wanted):
                assert all(isinstance(v, float) and math.isnan(v) for v in values)
            else:
                assert all(v == wanted for v in values)
        seen.append(
            tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in key.values())
        )
    assert len(seen) == len(set(seen)), "a partition's rows split over two groups"
