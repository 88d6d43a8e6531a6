"""MESHJOIN partitioning: a disjoint, complete, byte-balanced split of the files."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from joins.ssbj.mesh_partitions import partition_by_bytes

files = st.lists(
    st.tuples(st.text("abcdef", min_size=1, max_size=6), st.integers(0, 10_000)),
    unique_by=lambda f: f[0],
    max_size=40,
)


@given(files, st.integers(1, 12))
def test_parts_are_disjoint_cover_and_balanced(fs: list[tuple[str, int]], k: int) -> None:
    parts = partition_by_bytes(fs, k)
    assert len(parts) == k
    flat = [p for part in parts for p in part]
    assert sorted(flat) == sorted(p for p, _ in fs)
    size = dict(fs)
    loads = [sum(size[p] for p in part) for part in parts]
    if fs:
        assert max(loads) - min(loads) <= max(size.values())
    assert partition_by_bytes(list(reversed(fs)), k) == parts  # deterministic
