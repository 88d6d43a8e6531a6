"""Key loads of every bucket at once against each bucket's own (``joins.ssbj.key_loads``)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from joins.ssbj.key_loads import heaviest, key_loads, key_loads_by_bucket
from joins.ssbj.roles import (
    BUCKET,
    CACHE,
    COUNTER,
    KEY_HASH,
    MARKED,
    NEW,
    PARTITION,
    PENDING,
    PROBES,
    ROLE,
    STORED,
    SWITCH,
)

ROLES = [NEW, PENDING, CACHE, PARTITION, COUNTER, MARKED, SWITCH]


@settings(deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(ROLES), st.integers(-4, 12)), max_size=80),
    st.integers(0, 6),
)
def test_all_buckets_at_once_equal_each_bucket_alone(rows: list[tuple[str, int]], top: int) -> None:
    """A key hash lives in one bucket (hash mod 3 here); a bucket whose rows are only
    counters or s_B still reports its zero totals."""
    labels = [h % 3 * 5 for _, h in rows]
    table = pa.table(
        {
            ROLE: pa.array([r for r, _ in rows], pa.string()),
            KEY_HASH: pa.array([h for _, h in rows], pa.int64()),
            BUCKET: pa.array(labels, pa.int32()),
        }
    )
    expected = [
        row
        for label in sorted(set(labels))
        for row in key_loads(table.filter(pc.equal(table.column(BUCKET), label)), top).to_pylist()
    ]
    assert key_loads_by_bucket(table, top).to_pylist() == expected
    for label in set(labels):
        mine = [(r, h) for (r, h), b in zip(rows, labels, strict=True) if b == label]
        totals = [row for row in expected if row[BUCKET] == label and row[KEY_HASH] is None]
        stored = sum(r in (PENDING, CACHE) for r, _ in mine)
        probes = sum(r in (NEW, PARTITION) for r, _ in mine)
        assert [(t[STORED], t[PROBES]) for t in totals] == [(stored, probes)]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(-50, 50)), unique_by=lambda x: x[1]),
    st.integers(0, 12),
)
def test_the_heaviest_are_the_first_of_a_full_sort(keys: list[tuple[int, int]], top: int) -> None:
    gain = np.array([g for g, _ in keys], np.int64)
    hashes = np.array([h for _, h in keys], np.int64)
    order = heaviest(gain, hashes, top)
    expected = sorted(range(len(keys)), key=lambda i: (-keys[i][0], keys[i][1]))[:top]
    assert order.tolist() == expected
