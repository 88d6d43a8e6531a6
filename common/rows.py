"""Rows held as an Arrow table or a Spark DataFrame, converted on demand.

A :class:`Rows` value is a recipe for rows, built once and read in the form its consumer
needs: ``to_arrow()`` in the driver's memory (a small batch's audit, no Spark job),
``to_spark()`` as a lazy Spark frame (a large batch, a backfill). It is one of:

- a source: an Arrow table or a Spark frame given (:meth:`Rows.of`), or a reader of each
  form (:meth:`Rows.read`: the same rows read by delta-rs into Arrow, or by Spark);
- a transform of other Rows (:meth:`Rows.apply`), written once against narwhals' lazy
  frame API, which runs on pyarrow and on PySpark alike.

So an operation is written once and runs on either engine; the form a consumer asks for
decides where. A source given in one form only is converted when asked for the other (a
Spark frame collected with ``toArrow``, an Arrow table made a Spark frame).

Invariant: ``r.to_arrow()`` and ``r.to_spark(spark).toArrow()`` hold the same multiset of
rows with the same column names and types for every ``r`` whose transforms are pure
(``tests/common/test_rows.py``; each transform's tests run it on both).

The few primitives narwhals does not offer on PySpark (epoch microseconds of a timestamp
and back, a timestamp floored to a step) are the frame functions at the end of this
module: the one place, besides the conversions, that knows both engines. On Spark every
narwhals frame operation is a plan of its own (about 12 ms each in a classic session,
measured), so a transform on a hot path is written as one projection where it can be.

Rows of an Arrow table are selected by mask or by position without copying them when they
are one run (:func:`rows_where`, :func:`rows_at`): a step's tables are laid out in runs (the
keyed rows are the new tuples, then the stored state role by role, then the master
partitions; a step's result is its output, then its state role by role; a write groups rows
by partition value), so selecting a role, a segment or a partition's rows selects one
contiguous run. ``Table.filter`` and ``Table.take`` copy every column of the rows they keep
(at 1.6M pending tuples, a few hundred milliseconds a step); a slice copies nothing.
Invariants: :func:`rows_where` returns exactly the rows ``table.filter(mask)`` returns (a
null in the mask drops its row), :func:`rows_at` exactly those ``table.take(positions)``
does, in the same order.

Spark is imported only where a Spark frame is made or changed, so the Spark-free algorithm
modules that select rows here do not load it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import narwhals.stable.v2 as nw
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Frame = nw.LazyFrame[Any]
# Rows in one form or the other, where a function keeps the form it was given.
Native = TypeVar("Native", "DataFrame", pa.Table)
Transform = Callable[..., Frame]


class Rows:
    """Rows as Arrow or Spark, converted on demand (see the module docstring)."""

    def __init__(
        self,
        arrow: Callable[[], pa.Table] | None = None,
        spark: Callable[[SparkSession | None], DataFrame] | None = None,
    ) -> None:
        if arrow is None and spark is None:
            raise ValueError("Rows needs a way to read them: an Arrow reader, a Spark one, or both")
        self._arrow_reader = arrow
        self._spark_reader = spark
        self._table: pa.Table | None = None
        self._frame: DataFrame | None = None

    # ------------------------------------------------------------------ building

    @classmethod
    def of(cls, rows: pa.Table | DataFrame) -> Rows:
        """Rows already in one form."""
        if isinstance(rows, pa.Table):
            return cls(arrow=lambda: rows)
        return cls(spark=lambda _spark: rows)

    @classmethod
    def read(cls, arrow: Callable[[], pa.Table], spark: Callable[[], DataFrame]) -> Rows:
        """The same rows read either way: ``arrow`` in the driver, ``spark`` as a frame."""
        return cls(arrow=arrow, spark=lambda _spark: spark())

    @classmethod
    def apply(cls, transform: Transform, *inputs: Rows | None, **options: Any) -> Rows:
        """``transform(*frames, **options)`` over ``inputs`` as narwhals lazy frames (None
        stays None), on the engine the result is asked for."""

        def on_arrow() -> pa.Table:
            frames = [None if r is None else _lazy(r.to_arrow()) for r in inputs]
            return transform(*frames, **options).collect().to_native()

        def on_spark(spark: SparkSession | None) -> DataFrame:
            frames = [None if r is None else _lazy(r.to_spark(spark)) for r in inputs]
            frame: DataFrame = transform(*frames, **options).to_native()
            return frame

        return cls(arrow=on_arrow, spark=on_spark)

    # ------------------------------------------------------------------ reading

    def to_arrow(self) -> pa.Table:
        """The rows in the driver's memory (read once)."""
        if self._table is None:
            if self._arrow_reader is not None:
                self._table = self._arrow_reader()
            else:
                self._table = self.to_spark().toArrow()
        return self._table

    def to_spark(self, spark: SparkSession | None = None) -> DataFrame:
        """The rows as a Spark frame (planned once); ``spark`` makes a frame of rows read
        in the driver only, and is needed only then."""
        if self._frame is None:
            if self._spark_reader is not None:
                self._frame = self._spark_reader(spark)
            else:
                if spark is None:
                    raise ValueError(
                        "these rows were read into the driver's memory; a SparkSession is "
                        "needed to make a Spark frame of them, and none was given"
                    )
                self._frame = spark.createDataFrame(self.to_arrow())
        return self._frame


def _lazy(native: pa.Table | DataFrame) -> Frame:
    frame = nw.from_native(native)
    return frame.lazy() if isinstance(frame, nw.DataFrame) else frame


# ---------------------------------------------------------------- primitives on both engines


def with_epoch_micros(frame: Frame, column: str, name: str) -> Frame:
    """``frame`` with ``name``: microseconds since the epoch of the timestamp ``column``
    (null stays null)."""
    native = frame.to_native()
    if isinstance(native, pa.Table):
        micros = pc.cast(native.column(column).cast(pa.timestamp("us", "UTC")), pa.int64())
        return _lazy(_set(native, name, micros))
    from pyspark.sql import functions as F

    return _lazy(native.withColumn(name, F.unix_micros(F.col(column))))


def with_time_floor(frame: Frame, column: str, step_seconds: int, name: str) -> Frame:
    """``frame`` with ``name``: the timestamp ``column`` floored to a multiple of
    ``step_seconds`` since the epoch (below zero too), in UTC; null stays null. One
    projection on Spark (a narwhals chain of three would plan three)."""
    step = step_seconds * 1_000_000
    native = frame.to_native()
    if isinstance(native, pa.Table):
        micros = pc.cast(native.column(column).cast(pa.timestamp("us", "UTC")), pa.int64())
        valid = pc.is_valid(micros).to_numpy(zero_copy_only=False)
        floored = np.floor_divide(micros.fill_null(0).to_numpy(), step) * step  # exact
        stamps = pa.array(floored, pa.int64(), mask=~valid).cast(pa.timestamp("us", "UTC"))
        return _lazy(_set(native, name, stamps))
    from pyspark.sql import functions as F

    floored = (F.floor(F.unix_micros(F.col(column)) / step) * step).cast("long")
    return _lazy(native.withColumn(name, F.timestamp_micros(floored)))


def with_timestamp_of_micros(frame: Frame, column: str, name: str) -> Frame:
    """``frame`` with ``name``: the UTC timestamp of the epoch microseconds in ``column``."""
    native = frame.to_native()
    if isinstance(native, pa.Table):
        stamps = native.column(column).cast(pa.int64()).cast(pa.timestamp("us", "UTC"))
        return _lazy(_set(native, name, stamps))
    from pyspark.sql import functions as F

    return _lazy(native.withColumn(name, F.timestamp_micros(F.col(column))))


def _set(table: pa.Table, name: str, values: pa.ChunkedArray | pa.Array) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.schema.get_field_index(name), name, values)
    return table.append_column(name, values)


# ---------------------------------------------------------------- rows of an Arrow table

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


class TableOfParts:
    """Rows added in parts into one table of ``schema``: a part gives some of its columns
    (the others are null) and one value of the ``tag`` column for all of its rows."""

    def __init__(self, schema: pa.Schema, tag: str) -> None:
        self.schema = schema
        self.tag = tag
        self.parts: list[pa.Table] = []

    def add(self, tag_value: Any, n: int, columns: Mapping[str, Any]) -> None:
        """``n`` rows; ``columns``: Python lists, or Arrow columns of the schema's types."""
        if n == 0:
            return
        arrays: list[Any] = []
        for f in self.schema:
            value = columns.get(f.name)
            if f.name == self.tag:
                arrays.append(pa.repeat(pa.scalar(tag_value, f.type), n))
            elif value is None:
                arrays.append(pa.nulls(n, f.type))
            elif isinstance(value, pa.ChunkedArray | pa.Array):
                arrays.append(value.cast(f.type))
            else:
                arrays.append(pa.array(value, f.type))
        self.parts.append(pa.Table.from_arrays(arrays, schema=self.schema).combine_chunks())

    def table(self) -> pa.Table:
        if not self.parts:
            return self.schema.empty_table()
        return pa.concat_tables(self.parts)
