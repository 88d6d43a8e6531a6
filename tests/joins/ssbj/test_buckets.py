"""Key loads (``joins/ssbj/key_loads.py``): each bucket's load and heaviest keys, every
bucket at once against each bucket alone, and the loads read back by the monitor."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from joins.skew.greedyfit import KeyLoad
from joins.skew.key_routing import BucketLoad, task_labels
from joins.ssbj.buckets import heaviest, key_loads, key_loads_by_bucket
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
from joins.ssbj.step import bucket_loads

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


@settings(deadline=None)  # the first call loads Arrow's kernels
@given(
    st.lists(
        st.tuples(st.sampled_from([NEW, PENDING, CACHE, PARTITION, COUNTER]), st.integers(0, 6)),
        max_size=60,
    ),
    st.integers(0, 8),
)
def test_key_loads_rank_as_a_full_sort_would(rows: list[tuple[str, int]], top: int) -> None:
    """The heaviest keys are the first ``top`` of every key with some load sorted by
    Eq. 8's gain (descending), ties by hash (ascending), ties included: computed here by
    Python. A key with only counters weighs nothing and is not ranked."""
    table = pa.table(
        {
            ROLE: pa.array([r for r, _ in rows], pa.string()),
            KEY_HASH: pa.array([h for _, h in rows], pa.int64()),
            BUCKET: pa.array([3] * len(rows), pa.int32()),
        }
    )
    stored: dict[int, int] = {}
    probes: dict[int, int] = {}
    for role, h in rows:
        stored[h] = stored.get(h, 0) + (role in (PENDING, CACHE))
        probes[h] = probes.get(h, 0) + (role in (NEW, PARTITION))
    total_s, total_p = sum(stored.values()), sum(probes.values())
    weighed = [h for h in stored if stored[h] or probes[h]]
    expected = sorted(weighed, key=lambda h: (-(probes[h] * total_s + stored[h] * total_p), h))
    got = key_loads(table, top=top).to_pylist()
    assert [r[KEY_HASH] for r in got[:-1]] == expected[:top]
    assert (got[-1][STORED], got[-1][PROBES]) == (total_s, total_p)


def test_key_loads_count_state_and_probes_per_key_and_rank_the_heaviest() -> None:
    """A bucket's load rows: totals (null hash) and the top keys by Eq. 8's own-side
    benefit; a replica does not count the copies of a split key's cache rows as stored."""
    roles = [NEW, NEW, NEW, PENDING, CACHE, PARTITION, COUNTER, NEW, CACHE, CACHE]
    hashes = [1, 1, 1, 1, 1, 1, 1, 2, 3, 3]
    table = pa.table(
        {
            ROLE: pa.array(roles),
            KEY_HASH: pa.array(hashes, pa.int64()),
            BUCKET: pa.array([7] * len(roles), pa.int32()),
        }
    )
    rows = key_loads(table, top=2).to_pylist()
    assert rows[-1] == {BUCKET: 7, KEY_HASH: None, STORED: 4, PROBES: 5}
    # key 1: stored 2, probes 4; key 2: 0, 1; key 3: 2, 0. Benefit 4*p + 5*s: 26, 4, 10
    assert [(r[KEY_HASH], r[STORED], r[PROBES]) for r in rows[:-1]] == [(1, 2, 4), (3, 2, 0)]
    copies = key_loads(table, top=5, replicated=pa.array([3], pa.int64())).to_pylist()
    assert copies[-1][STORED] == 2
    loads = bucket_loads([(task_labels(8)[3], None, 4, 5), (task_labels(8)[3], 1, 2, 4)], buckets=8)
    assert loads == [BucketLoad(3, 4, 5, (KeyLoad(1, 2, 4),))]
    try:
        bucket_loads([(-5, None, 1, 1)], buckets=8)
    except ValueError as e:
        assert "label -5" in str(e)
    else:
        raise AssertionError("a load row of an unknown bucket label was accepted")
