"""The tables of the columnar SSBJ step (:mod:`joins.ssbj.columnar`): the bucket table's
columns it reads and writes (:class:`ColumnarLayout`), and its Arrow kernels: a role's
rows, membership, distinct values and their counts, per-key look-ups, and the counters
table (f_count, s_count, partitions observed) with its updates. Every role table carries
the join value as :data:`KEY`, in the master's type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.rows import rows_where
from joins.ssbj.roles import (
    HITS,
    MASTER_ROWS,
    OBSERVED,
    ROLE,
    master_field,
    stream_field,
)

_POS = "__pos"  # a stream tuple's row in its role table

KEY = "__key"  # the join value, as the master's type, on every role table here


@dataclass(frozen=True)
class ColumnarLayout:
    """The bucket table's columns this module reads and writes."""

    stream_fields: tuple[str, ...]  # s__<column>, every stream column
    master_fields: tuple[str, ...]  # r__<column>, every projected master column
    stream_key: str  # the stream's join column (its s__ field)
    master_key: str  # the master's join column (its r__ field)

    @classmethod
    def of(
        cls,
        stream_columns: tuple[str, ...],
        master_columns: tuple[str, ...],
        stream_keys: tuple[str, ...],
        master_keys: tuple[str, ...],
    ) -> ColumnarLayout | None:
        """None when the join has more than one column (the reference model runs it)."""
        if len(stream_keys) != 1 or len(master_keys) != 1:
            return None
        return cls(
            tuple(stream_field(c) for c in stream_columns),
            tuple(master_field(c) for c in master_columns),
            stream_field(stream_keys[0]),
            master_field(master_keys[0]),
        )


def supports(table: pa.Table, layout: ColumnarLayout) -> bool:
    """Whether the join column's type compares in Arrow as the join compares it."""
    key = table.schema.field(layout.master_key).type
    stream = table.schema.field(layout.stream_key).type
    if pa.types.is_string(key):
        return pa.types.is_string(stream)
    # A stream key is cast to the master's type: only one that widens to it casts safely
    # (a wider value the master type cannot hold would fail, where it just matches nothing).
    return (
        pa.types.is_signed_integer(key)
        and pa.types.is_signed_integer(stream)
        and stream.bit_width <= key.bit_width
    )


def role_rows(table: pa.Table, role: str) -> pa.Table:
    # A role's rows are one run of the step's rows (``common.rows``): a slice.
    return rows_where(table, pc.equal(table.column(ROLE), role))


def with_key(rows: pa.Table, column: str, key_type: pa.DataType) -> pa.Table:
    return rows.append_column(KEY, rows.column(column).cast(key_type))


def member_of(values: pa.ChunkedArray | pa.Array, keys: pa.Array) -> pa.ChunkedArray:
    """Membership (a null is in nothing: null join values match no row)."""
    return pc.fill_null(pc.is_in(values, value_set=keys, skip_nulls=True), False)


def distinct(values: pa.ChunkedArray | pa.Array) -> pa.Array:
    found = pc.unique(values)
    if isinstance(found, pa.ChunkedArray):
        found = found.combine_chunks()
    return found.drop_null()


def value_counts(values: pa.ChunkedArray | pa.Array, key_type: pa.DataType) -> pa.Table:
    """(key, n) per distinct non-null value."""
    table = pa.table({KEY: values})
    table = rows_where(table, pc.is_valid(table.column(KEY)))
    if table.num_rows == 0:
        return pa.table({KEY: pa.array([], key_type), "n": pa.array([], pa.int64())})
    counted = table.group_by(KEY).aggregate([(KEY, "count")])
    return counted.select([KEY, f"{KEY}_count"]).rename_columns([KEY, "n"])


def lookup(keys: pa.Array | pa.ChunkedArray, table: pa.Table, column: str) -> np.ndarray:
    """``column`` of ``table`` (one row per key) for each of ``keys``; 0 where absent."""
    if table.num_rows == 0 or len(keys) == 0:
        return np.zeros(len(keys), dtype=np.int64)
    index = pc.index_in(keys, value_set=table.column(KEY))
    values = np.asarray(table.column(column).to_numpy(zero_copy_only=False), dtype=np.int64)
    found = index.to_numpy(zero_copy_only=False)
    missing = np.isnan(found) if found.dtype.kind == "f" else np.zeros(len(found), bool)
    where = np.where(missing, 0, np.nan_to_num(found)).astype(np.int64)
    result = values[where] if len(values) else np.zeros(len(keys), dtype=np.int64)
    result[missing] = 0
    return result


@dataclass
class Counters:
    """f_count, s_count and the partitions observed, one row per value (key column)."""

    table: pa.Table

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> np.ndarray:
        return np.array(self.table.column(name).to_numpy(zero_copy_only=False), np.int64)

    def with_columns(self, columns: dict[str, np.ndarray]) -> Counters:
        table = self.table
        for name, values in columns.items():
            index = table.schema.get_field_index(name)
            table = table.set_column(index, name, pa.array(values, pa.int64()))
        return Counters(table)

    def without_s_count(self) -> Counters:
        """s_count and its partitions reset (line 12), and the values left with no
        counter at all dropped."""
        zeros = np.zeros(len(self), np.int64)
        return self.with_columns({MASTER_ROWS: zeros, OBSERVED: zeros}).nonzero()

    def nonzero(self) -> Counters:
        """The values with some counter above zero (``KeyCounters.is_zero``)."""
        table = self.table
        kept = pc.or_(
            pc.or_(pc.not_equal(table.column(HITS), 0), pc.not_equal(table.column(MASTER_ROWS), 0)),
            pc.not_equal(table.column(OBSERVED), 0),
        )
        return Counters(table.filter(kept))

    def add(
        self, key_type: pa.DataType, keys: pa.Array, increments: dict[str, np.ndarray]
    ) -> Counters:
        """Counters of ``keys`` (distinct values; created at zero) incremented by
        ``increments``: the counters in their order, then the values that had none, in
        the order of ``keys``."""
        # One hash look-up of the keys among the counters: where each is, or null.
        at = pc.index_in(keys, value_set=self.table.column(KEY)).to_numpy(zero_copy_only=False)
        found = ~np.isnan(at) if at.dtype.kind == "f" else np.ones(len(at), bool)
        rows = np.nan_to_num(at[found]).astype(np.int64)
        absent = keys.filter(pa.array(~found))
        updated = {}
        for name in (HITS, MASTER_ROWS, OBSERVED):
            column = self.column(name)
            by = increments.get(name)
            added = np.zeros(len(absent), np.int64)
            if by is not None:
                by = np.asarray(by, np.int64)
                column[rows] += by[found]
                added += by[~found]
            updated[name] = np.concatenate([column, added])
        # One chunk: appended to step after step, the key column would gain a chunk each.
        known = self.table.column(KEY).chunks
        return Counters(
            pa.table(
                {
                    KEY: pa.concat_arrays([*known, absent.cast(key_type)]),
                    **{name: pa.array(values, pa.int64()) for name, values in updated.items()},
                }
            )
        )


def constant(value: object, kind: pa.DataType, n: int) -> pa.Array:
    """``n`` times ``value`` (pa.repeat: a Python list of n values costs ~1 µs a row)."""
    return pa.repeat(pa.scalar(value, kind), n)


def counts_of(table: pa.Table) -> np.ndarray:
    return np.asarray(table.column("n").to_numpy(zero_copy_only=False), np.int64)


def with_column(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    index = table.schema.get_field_index(name)
    return table.set_column(index, table.schema.field(name).with_type(values.type), values)


def row_numbers(n: int) -> pa.Array:
    return pa.array(np.arange(n, dtype=np.int64))
