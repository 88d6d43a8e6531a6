"""A-DSP theta join on Spark: two-layer routing (Alg. 3) and sorted local joins per task.

Routing uses no Python UDF and no join: a tuple's bucket is a binary search over the
histogram boundaries (nested ``CASE WHEN``), its slot a hash of its columns, and a constant
array indexed by (bucket, slot) holds the task ids it must reach; ``explode`` replicates the
tuple. Every
candidate (R, S) pair meets in exactly one task (see ``joins.theta.adsp.plan``).

Inside a task (``cogroup().applyInArrow``) the master rows are sorted by key and each stream
row finds its candidate slice with ``numpy.searchsorted`` (the band/inequality merge, in the
spirit of STA's sorted index); range predicates then filter the slice exactly. The residual
filter, if any, is applied by Spark on the joined rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.theta.adsp.plan import Histogram, ThetaPlan, routing_rows
from joins.theta.predicate import ThetaPredicate

TASK = "_task"
BUCKET = "_bucket"
SLOT = "_slot"


@dataclass(frozen=True)
class KeySpec:
    """Which columns order each side, and the numeric form both sides compare in."""

    stream_key: str
    master_key: str  # ordering key of the master: master_column, or lo for ranges
    master_high: str | None  # hi of a range predicate


def key_spec(predicate: ThetaPredicate) -> KeySpec:
    if predicate.type == "range":
        assert predicate.lo and predicate.hi
        return KeySpec(predicate.stream_column, predicate.lo, predicate.hi)
    assert predicate.master_column
    return KeySpec(predicate.stream_column, predicate.master_column, None)


def numeric(column: Column, data_type: T.DataType) -> Column:
    """Dates as days, timestamps as microseconds since the epoch, numbers as doubles."""
    if isinstance(data_type, T.DateType):
        return F.unix_date(column).cast(T.DoubleType())
    if isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        return F.unix_micros(column).cast(T.DoubleType())
    return column.cast(T.DoubleType())


def bucket_of(value: Column, histogram: Histogram) -> Column:
    """``#{k : b_k < v}``, the same rule as ``Histogram.bucket``; null for a null value.

    A binary search written as nested ``CASE WHEN``: ``bucket(v) <= m`` exactly when
    ``v <= b_m``, so ``log2(B)`` comparisons place a row where a sum over all ``B``
    boundaries took ``B``. NaN sorts above every number in Spark, so it lands in the last
    bucket either way.
    """
    bounds = histogram.boundaries

    def search(low: int, high: int) -> Column:
        if low == high:
            return F.lit(low)
        middle = (low + high) // 2
        return F.when(value <= F.lit(bounds[middle]), search(low, middle)).otherwise(
            search(middle + 1, high)
        )

    return (
        F.when(value.isNull(), F.lit(None)).otherwise(search(0, len(bounds))).cast(T.IntegerType())
    )


def route(
    frame: DataFrame,
    key: Column,
    histogram: Histogram,
    plan: ThetaPlan,
    side: str,
    slots: int,
    instances: Sequence[int] | None = None,
    keep_position: bool = False,
) -> DataFrame:
    """Attach ``_task`` and replicate each row to every task it must reach.

    ``instances`` renames plan task ``t`` to ``instances[t]`` (the physical task that
    holds it in a persisted layout); ``keep_position`` keeps ``_bucket`` and ``_slot``.
    """
    rows = routing_rows(plan, side, slots)
    if instances is not None:
        rows = [(b, slot, [instances[t] for t in tasks]) for b, slot, tasks in rows]
    keyed = frame.withColumn(BUCKET, bucket_of(key, histogram)).withColumn(
        SLOT, F.pmod(F.xxhash64(*[F.col(c) for c in frame.columns]), F.lit(slots)).cast("int")
    )
    position = [F.col(BUCKET), F.col(SLOT)] if keep_position else []
    cell = F.col(BUCKET) * slots + F.col(SLOT)
    tasks = routing_lookup(rows, len(histogram.bucket_bytes), slots, cell)
    return keyed.select(*frame.columns, *position, F.explode(tasks).alias(TASK))


def routing_lookup(
    rows: Sequence[tuple[int, int, list[int]]], buckets: int, slots: int, cell: Column
) -> Column:
    """The tasks of routing-table cell ``cell`` (``bucket * slots + slot``), as a constant
    lookup: an index array over the cells into the table's distinct task lists, the empty
    list where the table has no row (the tuple is dropped, as the join on the table
    dropped it). Looking a tuple up is two array indexes, where a broadcast join on
    (bucket, slot) cost a hash probe per row: routing both 1M-row sides took 1.95 s that
    way and 1.01 s this way (BENCHMARKS.md, session 13).

    Both arrays are SQL literals parsed in one call. Built from ``F.array``/``F.lit``
    columns, the table's thousands of Py4J calls took about 9 s per join; as one array
    of per-cell arrays it took 0.32 s to plan against 0.18 s for these two flat ones.
    """
    empty: tuple[int, ...] = ()
    cells = [empty] * (buckets * slots)
    for bucket, slot, tasks in rows:
        cells[bucket * slots + slot] = tuple(int(t) for t in tasks)
    distinct = sorted(set(cells))
    position = {tasks: index for index, tasks in enumerate(distinct)}
    lists = ",".join(
        f"array({','.join(map(str, tasks))})" if tasks else "cast(array() as array<int>)"
        for tasks in distinct
    )
    index = ",".join(str(position[tasks] + 1) for tasks in cells)
    return F.element_at(
        F.expr(f"array({lists})"), F.element_at(F.expr(f"array({index})"), cell + 1)
    )


def local_join_function(
    predicate: ThetaPredicate,
    stream_columns: list[str],
    master_columns: list[str],
    output_schema: pa.Schema,
) -> Callable[[pa.Table, pa.Table], pa.Table]:
    """The per-task join for ``applyInArrow``: sorted search, then exact filtering."""
    keys = key_spec(predicate)
    lower, upper = predicate.band_bounds()

    def as_numbers(array: pa.ChunkedArray | pa.Array) -> np.ndarray:
        if pa.types.is_date(array.type):
            array = array.cast(pa.int32())
        elif pa.types.is_timestamp(array.type):
            array = array.cast(pa.int64())
        return np.asarray(array.to_numpy(zero_copy_only=False), dtype=float)

    def join(stream: pa.Table, master: pa.Table) -> pa.Table:
        if stream.num_rows == 0 or master.num_rows == 0:
            return output_schema.empty_table()
        s = as_numbers(stream.column(keys.stream_key))
        r = as_numbers(master.column(keys.master_key))
        order = np.argsort(r, kind="stable")
        r_sorted = r[order]
        n = len(r_sorted)
        kind = predicate.type
        if kind == "band":
            first = np.searchsorted(r_sorted, s - lower, "left")
            last = np.searchsorted(r_sorted, s + upper, "right")
        elif kind == "less":  # s < r
            first, last = np.searchsorted(r_sorted, s, "right"), np.full(len(s), n)
        elif kind == "less_equal":
            first, last = np.searchsorted(r_sorted, s, "left"), np.full(len(s), n)
        elif kind == "greater":  # s > r
            first, last = np.zeros(len(s), dtype=int), np.searchsorted(r_sorted, s, "left")
        elif kind == "greater_equal":
            first, last = np.zeros(len(s), dtype=int), np.searchsorted(r_sorted, s, "right")
        else:  # range: lo <= s, then hi > s exactly
            first, last = np.zeros(len(s), dtype=int), np.searchsorted(r_sorted, s, "right")
        counts = np.maximum(last - first, 0)
        stream_index = np.repeat(np.arange(len(s)), counts)
        offsets = np.repeat(first - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        master_index = order[np.arange(int(counts.sum())) + offsets]
        valid = ~np.isnan(s[stream_index]) & ~np.isnan(r[master_index])
        if kind == "range":
            assert keys.master_high
            high = as_numbers(master.column(keys.master_high))
            valid &= high[master_index] > s[stream_index]
        stream_index, master_index = stream_index[valid], master_index[valid]
        left = stream.select(stream_columns).take(pa.array(stream_index))
        right = master.select(master_columns).take(pa.array(master_index))
        arrays = [*left.columns, *right.columns]
        return pa.Table.from_arrays(arrays, schema=output_schema)

    return join


def adsp_join(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    plan: ThetaPlan,
    slots: int = 64,
) -> DataFrame:
    """Inner theta join of ``stream`` and ``master`` laid out by ``plan``."""
    keys = key_spec(predicate)
    stream_key = numeric(F.col(keys.stream_key), stream.schema[keys.stream_key].dataType)
    master_key = numeric(F.col(keys.master_key), master.schema[keys.master_key].dataType)
    sides = RoutedSides(
        route(stream, stream_key, plan.stream, plan, "stream", slots),
        route(master, master_key, plan.master, plan, "master", slots),
        stream.schema,
        master.schema,
    )
    return join_routed(sides, predicate)


@dataclass(frozen=True)
class RoutedSides:
    """Both sides of an A-DSP join, each row carrying the ``_task`` routing gave it, and
    the columns each side brings to the output."""

    stream: DataFrame
    master: DataFrame
    stream_schema: T.StructType
    master_schema: T.StructType


def join_routed(sides: RoutedSides, predicate: ThetaPredicate) -> DataFrame:
    """The local joins: each task joins its rows.

    A band predicate joins in the JVM (:func:`binned_local_join`); the others sort and
    search in Python workers (:func:`sorted_local_join`).
    """
    if predicate.type == "band":
        joined = binned_local_join(sides, predicate)
    else:
        joined = sorted_local_join(sides, predicate)
    # The residual is plain SQL over both sides' columns: Spark applies it to the pairs.
    return joined.where(F.expr(predicate.residual)) if predicate.residual else joined


def sorted_local_join(sides: RoutedSides, predicate: ThetaPredicate) -> DataFrame:
    """Each task's rows in one Python call (``cogroup().applyInArrow``): sorted search."""
    from pyspark.sql.pandas.types import to_arrow_schema

    stream_schema, master_schema = sides.stream_schema, sides.master_schema
    out_schema = T.StructType([*stream_schema.fields, *master_schema.fields])
    function = local_join_function(
        predicate,
        stream_schema.fieldNames(),
        master_schema.fieldNames(),
        to_arrow_schema(out_schema, timestamp_utc=True),
    )
    return (
        sides.stream.select(*stream_schema.fieldNames(), TASK)
        .groupBy(TASK)
        .cogroup(sides.master.select(*master_schema.fieldNames(), TASK).groupBy(TASK))
        .applyInArrow(function, out_schema)
    )


def binned_local_join(sides: RoutedSides, predicate: ThetaPredicate) -> DataFrame:
    """Band local joins as one JVM equi-join on (task, bin), then the exact band filter.

    Bins have the band's width ``w = lower + upper``: a stream row sits in bin
    ``floor(s / w)``, a master row in every bin its band ``[r - upper, r + lower]`` reaches
    (at most two). A matching pair shares the stream row's bin, so it is found once inside
    the one task where routing makes it meet (Alg. 3). The A-DSP task id salts the bin: a
    hot bin is split over the tasks the plan gave its stream rows. NaN keys never match,
    as in the Python local join (``floor(NaN)`` is no bin). No Python worker runs
    (BENCHMARKS.md, skew simulation: a Python task costs about 0.2 s on its own).
    """
    assert predicate.master_column
    stream_schema, master_schema = sides.stream_schema, sides.master_schema
    lower, upper = predicate.band_bounds()
    width = F.lit(max(lower + upper, 1e-9))
    s_key = numeric(F.col(predicate.stream_column), stream_schema[predicate.stream_column].dataType)
    r_key = numeric(F.col(predicate.master_column), master_schema[predicate.master_column].dataType)
    stream = sides.stream.where(~F.isnan(s_key)).select(
        *stream_schema.fieldNames(),
        F.col(TASK).alias("_s_task"),
        F.floor(s_key / width).cast("long").alias("_s_bin"),
        s_key.alias("_s_key"),
    )
    master = sides.master.where(~F.isnan(r_key)).select(
        *master_schema.fieldNames(),
        F.col(TASK).alias("_r_task"),
        F.explode(
            F.sequence(
                F.floor((r_key - F.lit(upper)) / width).cast("long"),
                F.floor((r_key + F.lit(lower)) / width).cast("long"),
            )
        ).alias("_r_bin"),
        r_key.alias("_r_key"),
    )
    condition = (
        (F.col("_s_task") == F.col("_r_task"))
        & (F.col("_s_bin") == F.col("_r_bin"))
        & (F.col("_r_key") >= F.col("_s_key") - F.lit(lower))
        & (F.col("_r_key") <= F.col("_s_key") + F.lit(upper))
    )
    return stream.join(master, condition, "inner").select(
        *stream_schema.fieldNames(), *master_schema.fieldNames()
    )


def flag_matches(
    stream: DataFrame,
    matched: DataFrame,
    master_schema: T.StructType,
    row_id: str,
) -> DataFrame:
    """Matched rows as they are, plus each unmatched stream row once, padded with nulls."""
    from joins.baseline import MATCHED

    unmatched = stream.join(matched.select(row_id).distinct(), row_id, "left_anti")
    nulls = [F.lit(None).cast(f.dataType).alias(f.name) for f in master_schema.fields]
    padded = unmatched.select(*stream.columns, *nulls).withColumn(MATCHED, F.lit(False))
    return matched.unionByName(padded)


def adsp_join_flagged(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    plan: ThetaPlan,
    master_name: str,
    master_version: int,
    row_id: str,
) -> DataFrame:
    """Like ``baseline.theta_join_flagged``: matches flagged, unmatched rows with nulls."""
    from joins.baseline import MATCHED, version_column

    right = master.withColumn(MATCHED, F.lit(True)).withColumn(
        version_column(master_name), F.lit(master_version).cast("bigint")
    )
    matched = adsp_join(stream, right, predicate, plan)
    return flag_matches(stream, matched, right.schema, row_id)
