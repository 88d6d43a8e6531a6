"""The wide table's layout, and one bucket's rows decoded for Algorithm 1.

A stream tuple reaches Algorithm 1 as ``(*join values, position in the bucket's table)``:
the algorithm only looks at the join value and carries the tuple, so the tuple's other
columns stay in Arrow and are gathered by position when the output and the new H_S are
encoded (``joins.ssbj.bucket_encode``; decoding every column to Python objects was most of
a step's time). Master rows are decoded whole (the cache compares them by value when the
master's changes arrive), and of a master partition only the rows whose join value the
bucket's tuples or s_B ask for. pyarrow only, no Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from common.rows import rows_at
from joins.ssbj.algorithm import (
    BucketState,
    KeyCounters,
    MasterDelta,
    PendingTuple,
    Reload,
    Row,
    RowChanges,
    StepPlan,
    join_value,
)
from joins.ssbj.roles import (
    ADDED,
    CACHE,
    CHANGE,
    COUNTER,
    EMPTY,
    ENTRY_STEP,
    HITS,
    MARKED,
    MASTER_ROWS,
    MATCHED,
    OBSERVED,
    PARTITION,
    PENDING,
    PINNED_VERSION,
    RELOAD,
    REMOVED,
    ROLE,
    SWITCH,
    VERSION,
    master_field,
    stream_field,
)


@dataclass(frozen=True)
class WideLayout:
    """Column names of the wide table, and which positions hold the join values."""

    stream_columns: tuple[str, ...]
    master_columns: tuple[str, ...]
    stream_keys: tuple[str, ...]
    master_keys: tuple[str, ...]

    @property
    def stream_key_positions(self) -> tuple[int, ...]:
        """Where a decoded stream tuple holds its join values: first, before the position."""
        return tuple(range(len(self.stream_keys)))

    @property
    def master_key_positions(self) -> tuple[int, ...]:
        return tuple(self.master_columns.index(c) for c in self.master_keys)

    @property
    def stream_fields(self) -> list[str]:
        return [stream_field(c) for c in self.stream_columns]

    @property
    def master_fields(self) -> list[str]:
        return [master_field(c) for c in self.master_columns]


@dataclass(frozen=True)
class BucketDeltas:
    """How H_R and s_B reach the plan's master version: by the rows commits changed
    (``changes``), by the rows at the new version (``reload``), or not at all (None)."""

    cache: str | None = None
    switch: str | None = None


def row_tuples(table: pa.Table, columns: Sequence[str]) -> list[Row]:
    if table.num_rows == 0:
        return []
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


class BucketRoles:
    """The rows of one bucket's table by role, with their positions in the table."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._roles = table.column(ROLE)

    def positions(self, role: str) -> pa.Array:
        return pc.indices_nonzero(pc.equal(self._roles, role))

    def rows(self, role: str) -> pa.Table:
        # A role's rows are one run of the bucket's rows (``common.rows``): a slice.
        return rows_at(self.table, self.positions(role))

    def stream_tuples(self, role: str, layout: WideLayout) -> tuple[list[Row], pa.Table]:
        """``(*join values, position)`` of the role's stream tuples, and their rows."""
        positions = self.positions(role)
        rows = rows_at(self.table, positions)
        keys = [rows.column(stream_field(c)).to_pylist() for c in layout.stream_keys]
        return list(zip(*keys, positions.to_pylist(), strict=True)), rows


def master_delta(
    roles: BucketRoles, role: str, kind: str | None, layout: WideLayout
) -> MasterDelta | None:
    if kind is None:
        return None
    if kind == "reload":
        return Reload(row_tuples(roles.rows(RELOAD), layout.master_fields))
    changes = roles.rows(role)
    change = changes.column(CHANGE).to_pylist()
    rows = row_tuples(changes, layout.master_fields)
    return RowChanges(
        removed=[r for r, c in zip(rows, change, strict=True) if c == REMOVED],
        added=[r for r, c in zip(rows, change, strict=True) if c == ADDED],
    )


def decode_state(roles: BucketRoles, layout: WideLayout, plan: StepPlan) -> BucketState:
    state = BucketState()
    tuples, pending = roles.stream_tuples(PENDING, layout)
    for row, entry, pinned, matched in zip(
        tuples,
        pending.column(ENTRY_STEP).to_pylist(),
        pending.column(PINNED_VERSION).to_pylist(),
        pending.column(MATCHED).to_pylist(),
        strict=True,
    ):
        state.pending.append(
            PendingTuple(row, plan.stream_key_of(row), entry, pinned, bool(matched))
        )
    cache = roles.rows(CACHE)
    for row, empty in zip(
        row_tuples(cache, layout.master_fields), cache.column(EMPTY).to_pylist(), strict=True
    ):
        rows = state.cache.setdefault(plan.master_key_of(row), [])
        if not empty:
            rows.append(row)
    counters = roles.rows(COUNTER)
    for key, hits, master_rows, observed in zip(
        _keys(counters, layout),
        counters.column(HITS).to_pylist(),
        counters.column(MASTER_ROWS).to_pylist(),
        counters.column(OBSERVED).to_pylist(),
        strict=True,
    ):
        known = state.counters.get(key)
        if known is None:
            state.counters[key] = KeyCounters(hits, master_rows, observed)
        else:
            # A split key's replicas hand their counters to its owner: hits add up (each
            # counted its own tuples); master rows were counted over the same partitions.
            state.counters[key] = KeyCounters(
                known.hits + hits,
                max(known.master_rows, master_rows),
                max(known.observed, observed),
            )
    for key in _keys(roles.rows(MARKED), layout):
        state.switch_buffer.setdefault(key, [])
    for row in row_tuples(roles.rows(SWITCH), layout.master_fields):
        state.switch_buffer.setdefault(plan.master_key_of(row), []).append(row)
    return state


def partition_rows(
    roles: BucketRoles, layout: WideLayout, wanted: set[tuple[Any, ...]]
) -> dict[int, list[Row]]:
    """The bucket's master partition rows by version, only of the ``wanted`` join values
    (with one join column the others are dropped in Arrow, before any is decoded)."""
    parts = roles.rows(PARTITION)
    if len(layout.master_keys) == 1 and parts.num_rows:
        column = parts.column(master_field(layout.master_keys[0]))
        values = pa.array([key[0] for key in wanted], type=column.type)
        if pa.types.is_floating(column.type):
            # is_in hashes bits: -0.0 would miss 0.0, and a NaN of other bits would miss
            # NaN (both equal in the join). One zero and one NaN on both sides.
            zero, nan = pa.scalar(0.0, column.type), pa.scalar(float("nan"), column.type)
            column = pc.if_else(
                pc.is_nan(column), nan, pc.if_else(pc.equal(column, zero), zero, column)
            )
            values = pc.if_else(
                pc.is_nan(values), nan, pc.if_else(pc.equal(values, zero), zero, values)
            )
        parts = parts.filter(pc.is_in(column, value_set=values))
    partitions: dict[int, list[Row]] = {}
    for row, version in zip(
        row_tuples(parts, layout.master_fields), parts.column(VERSION).to_pylist(), strict=True
    ):
        partitions.setdefault(int(version), []).append(row)
    return partitions


def _keys(table: pa.Table, layout: WideLayout) -> list[tuple[Any, ...]]:
    """The join values of key-only master rows (counters, marked values), decoded from
    the key columns alone, as :func:`joins.ssbj.algorithm.join_value` makes them."""
    rows = row_tuples(table, [master_field(c) for c in layout.master_keys])
    return [join_value(row, range(len(layout.master_keys))) for row in rows]
