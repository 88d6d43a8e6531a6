"""The join values a batch's tuples ask of a master, per key column, and which master rows
have them: a :data:`~warehouse.delta.api.RowMask` for an Arrow read, prepared once for
every file it reads, and the asked range of each integer key, to prune files by their log
statistics.

Invariant: :meth:`AskedKeys.row_mask` keeps exactly the rows whose every key is among the
asked values (a null key is never asked), whichever test a column uses
(``tests/joins/test_asked_keys.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# A bitmap over the asked values' range costs a byte a value of the range: used up to
# 64 MiB, and while the range is at most this many times the values asked (beyond, the
# values are few and far apart, and Arrow's hash set is the cheaper test).
_BITMAP_MAX_SPAN = 1 << 26
_BITMAP_SPAN_PER_VALUE = 4096


@dataclass(frozen=True)
class AskedValues:
    """One master key column's distinct asked values (no nulls), and how a row is tested
    against them: an integer key by one look-up in a bitmap of the values' range, built
    once a step, where Arrow's ``is_in`` builds a hash set of the values at every call (a
    file read); other keys by ``is_in``."""

    column: str
    values: pa.Array
    low: int | None = None  # the bitmap's first value; None: no bitmap
    bitmap: np.ndarray | None = None

    @classmethod
    def of(cls, column: str, values: pa.Array) -> AskedValues:
        if not pa.types.is_integer(values.type) or len(values) == 0:
            return cls(column, values)
        low, high = (v.as_py() for v in pc.min_max(values).values())
        span = high - low + 1
        if span > _BITMAP_MAX_SPAN or span > _BITMAP_SPAN_PER_VALUE * len(values):
            return cls(column, values)
        bitmap = np.zeros(span, dtype=np.bool_)
        bitmap[values.to_numpy().astype(np.int64) - low] = True
        return cls(column, values, low, bitmap)

    def bounds(self) -> tuple[Any, Any] | None:
        """The asked range (None: nothing asked)."""
        if len(self.values) == 0:
            return None
        low, high = pc.min_max(self.values).values()
        return (low.as_py(), high.as_py())

    def members(self, rows: pa.Table) -> pa.Array | pa.ChunkedArray:
        """Whether each row's value of the column is asked (a null is not)."""
        column = rows.column(self.column)
        if self.bitmap is None or self.low is None:
            return pc.is_in(column, value_set=self.values)
        valid = pc.is_valid(column).to_numpy(zero_copy_only=False)
        values = pc.fill_null(column, self.low).to_numpy().astype(np.int64, copy=False)
        inside = (values >= self.low) & (values < self.low + len(self.bitmap)) & valid
        # Out-of-range rows look up index 0 and are dropped by ``inside``; the subtraction
        # may wrap for them, never for a row inside.
        return pa.array(inside & self.bitmap[np.where(inside, values - self.low, 0)])


@dataclass(frozen=True)
class AskedKeys:
    """Per master key column, the distinct join values a step's tuples ask for."""

    columns: tuple[AskedValues, ...]

    def row_mask(self, rows: pa.Table) -> pa.Array | pa.ChunkedArray:
        """Which master rows (their own column names) have every key among the asked: a
        :data:`~warehouse.delta.api.RowMask`."""
        mask = self.columns[0].members(rows)
        for asked in self.columns[1:]:
            mask = pc.and_(mask, asked.members(rows))
        return mask

    def bounds(self) -> dict[str, tuple[Any, Any] | None]:
        """Each integer key's asked range (None: nothing asked of it), for pruning files
        by their log statistics; other keys are not bounded."""
        return {
            asked.column: asked.bounds()
            for asked in self.columns
            if pa.types.is_integer(asked.values.type)
        }
