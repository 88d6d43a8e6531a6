"""Rows of an Arrow table by mask or by position, without copying them when they are one run.

A step's tables are laid out in runs: the keyed rows are the new tuples, then the stored
state role by role (pending tuples by entry step), then the master partitions; a step's
result is its output, then its state role by role; a write groups rows by partition value.
Selecting a role, a segment, a partition's rows, or the pending tuples that stay after the
oldest chunk expires therefore selects one contiguous run. ``Table.filter`` and
``Table.take`` copy every column of the rows they keep (at 1.6M pending tuples, a few
hundred milliseconds a step); a slice copies nothing.

Invariants: :func:`rows_where` returns exactly the rows ``table.filter(mask)`` returns (a
null in the mask drops its row, as ``filter`` does by default), and :func:`rows_at` exactly
the rows ``table.take(positions)`` returns, in the same order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def rows_where(table: pa.Table, mask: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table.filter(mask)``: a zero-copy slice when the kept rows are one run."""
    if len(mask) != table.num_rows:
        raise ValueError(f"a mask of {len(mask)} values for a table of {table.num_rows} rows")
    at = pc.indices_nonzero(pc.fill_null(mask, False))
    if len(at) == 0:
        return table.slice(0, 0)
    first, last = at[0].as_py(), at[-1].as_py()
    if last - first + 1 == len(at):  # increasing indices as many as their span: one run
        return table.slice(first, len(at))
    return table.take(at)


def rows_at(table: pa.Table, positions: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table.take(positions)``: a zero-copy slice when the positions count up by one."""
    if len(positions) == 0:
        return table.slice(0, 0)
    values = np.asarray(positions.to_numpy(zero_copy_only=False))
    if values.dtype.kind in "iu" and bool(np.all(np.diff(values) == 1)):
        first = int(values[0])
        if first >= 0 and first + len(values) <= table.num_rows:
            return table.slice(first, len(values))
    return table.take(positions)
