"""Rows of an Arrow table by mask or by position, without copying them when they are one run.

A step's tables are laid out in runs: the keyed rows are the new tuples, then the stored
state role by role (pending tuples by entry step), then the master partitions; a step's
result is its output, then its state role by role; a write groups rows by partition value.
Selecting a role, a segment, a partition's rows, or the pending tuples that stay after the
oldest chunk expires therefore selects one contiguous run. ``Table.filter`` and
``Table.take`` copy every column of the rows they keep (at 1.6M pending tuples, a few
hundred milliseconds a step); a slice copies nothing. Rows kept in a few runs (the segments
a step rewrites: its new chunk and the counters) are those runs' slices, one chunk each.

Invariants: :func:`rows_where` returns exactly the rows ``table.filter(mask)`` returns (a
null in the mask drops its row, as ``filter`` does by default), and :func:`rows_at` exactly
the rows ``table.take(positions)`` returns, in the same order.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Kept rows in at most this many runs are returned as slices (a table of as many chunks);
# more runs are copied by ``take``, so that a scattered mask does not leave a table of
# thousands of tiny chunks for the kernels after it.
MAX_RUNS = 32


def rows_where(table: pa.Table, mask: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table.filter(mask)``: zero-copy slices when the kept rows are at most
    :data:`MAX_RUNS` runs."""
    if len(mask) != table.num_rows:
        raise ValueError(f"a mask of {len(mask)} values for a table of {table.num_rows} rows")
    at = pc.indices_nonzero(pc.fill_null(mask, False))
    if len(at) == 0:
        return table.slice(0, 0)
    first, last = at[0].as_py(), at[-1].as_py()
    if last - first + 1 == len(at):  # increasing indices as many as their span: one run
        return table.slice(first, len(at))
    positions = at.to_numpy()
    breaks = np.flatnonzero(np.diff(positions) != 1)
    if len(breaks) >= MAX_RUNS:
        return table.take(at)
    starts = [first, *(int(positions[b + 1]) for b in breaks)]
    ends = [*(int(positions[b]) + 1 for b in breaks), last + 1]
    return pa.concat_tables(
        [table.slice(start, end - start) for start, end in zip(starts, ends, strict=True)]
    )


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
