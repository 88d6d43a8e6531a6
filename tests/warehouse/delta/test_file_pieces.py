"""A large Arrow write's files (``embedded_writes.file_pieces``): every row once, in order, in
equal files of at most the limit."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from warehouse.delta.embedded_writes import file_pieces


@settings(deadline=None)
@given(st.integers(0, 200), st.integers(1, 50))
def test_pieces_hold_every_row_once_within_the_limit(rows: int, most: int) -> None:
    table = pa.table({"i": pa.array(range(rows), pa.int64())})
    pieces = file_pieces(table, most)
    assert [v for p in pieces for v in p.column("i").to_pylist()] == list(range(rows))
    assert all(0 < p.num_rows <= most for p in pieces)
    assert len(pieces) == -(-rows // most)
    if pieces:  # equal sizes: the last may be smaller, by less than one row per piece
        assert pieces[0].num_rows - pieces[-1].num_rows < len(pieces)
