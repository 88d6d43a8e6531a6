"""SSBJ and MESHJOIN steps as DataFrame transforms (seeds/ssbj_semi_stream_balanced_join.txt).

One step of the operator is one ``groupBy(bucket).applyInArrow`` pass: the step's new stream
tuples, the operator's state (H_S, H_R, the counters, s_B), master partition ``step mod k``
of every version the step needs and, when the master moved, the rows that changed, are
laid out as one wide table (``joins.ssbj.buckets``), split by the join value's hash into
buckets as the step's key routing says (``joins.skew.key_routing``: one bucket per Spark task,
hot keys moved by GreedyFit), and each bucket runs Algorithm 1 (``joins.ssbj.algorithm``).
The result holds the enriched rows, the whole new state and each bucket's load, so the
stateful driver (``pipeline.ssbj``) writes two tables per step: the output and the
operator state. The state scales out with executors like a keyed operator: a bucket is one
group.

Also here: :func:`scan_rows`, the assignment of master rows to the k partitions of the
cyclic scan, and the readers of the state table's roles.

Every enriched row has the input's columns, then the master's projected columns, then the
master version column; unmatched rows of left joins carry nulls there, like the baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.arrow_rows import rows_where
from common.sql_text import quoted_identifier, string_literal
from joins.columns import version_column
from joins.skew.asketch import SketchShape
from joins.skew.greedyfit import KeyLoad
from joins.skew.key_routing import BucketLoad, KeyRouting, task_labels
from joins.ssbj import spark_hash
from joins.ssbj.algorithm import StepPlan
from joins.ssbj.bucket_decode import BucketDeltas, WideLayout
from joins.ssbj.buckets import BucketStep, bucket_function
from joins.ssbj.late import LATE, LATE_SINCE, WAITING_SINCE, LateRule
from joins.ssbj.roles import (
    ADDED,
    ASKING_ROLES,
    BUCKET,
    CACHE,
    CACHE_CHANGE,
    CHANGE,
    EMPTY,
    ENTRY_STEP,
    HITS,
    KEY_HASH,
    KEY_LOAD,
    KEY_SKETCH,
    MARKED,
    MASTER_ROWS,
    MATCHED,
    METRIC,
    METRIC_ROLE,
    NEW,
    OBSERVED,
    OUT,
    PARTITION,
    PENDING,
    PINNED_VERSION,
    PROBES,
    RELOAD,
    REMOVED,
    ROLE,
    SKETCH,
    STATE_ROLES,
    STORED,
    STREAM_ROLES,
    SWITCH,
    SWITCH_CHANGE,
    VALUE,
    VERSION,
    master_field,
    stream_field,
)
from joins.ssbj.segments import SEGMENT, SHARED_SEGMENTS
from warehouse.delta.api import ADDED_CHANGES, REMOVED_CHANGES
from warehouse.delta.schema import spark_to_arrow

INPUT_VERSION = "_input_version"
SCAN_PART = "_scan_part"
__all__ = ["ENTRY_STEP", "INPUT_VERSION", "PINNED_VERSION", "SCAN_PART", "JoinSpec"]


@dataclass(frozen=True)
class JoinSpec:
    """What an SSBJ stage joins: key columns on both sides, master projection, join type."""

    stream_keys: tuple[str, ...]
    master_keys: tuple[str, ...]
    master_columns: tuple[str, ...]
    master_name: str
    how: str

    @property
    def version(self) -> str:
        return version_column(self.master_name)


def scan_rows(master_rows: DataFrame, spec: JoinSpec, partitions: int) -> DataFrame:
    """Projected master rows with their scan partition ``hash(row) mod k`` (MESHJOIN's R_p).

    A hash of the whole row, not of the join key: partition sizes stay within a few percent
    of |R|/k for any key skew (a key's rows spread over partitions, as in MESHJOIN, where a
    pending tuple meets every partition anyway). Deterministic, so a rerun recomputes the
    same partitions.
    """
    columns = [F.col(c) for c in spec.master_columns]
    part = F.pmod(F.xxhash64(*columns), F.lit(partitions)).cast(T.IntegerType())
    return master_rows.select(*columns, part.alias(SCAN_PART))


# Columns of the wide table beyond the stream (s__*) and master (r__*) columns.
_OPERATOR_FIELDS = (
    (ENTRY_STEP, T.LongType()),
    (PINNED_VERSION, T.LongType()),
    (MATCHED, T.BooleanType()),
    (VERSION, T.LongType()),
    (EMPTY, T.BooleanType()),
    (CHANGE, T.StringType()),
    (HITS, T.LongType()),
    (MASTER_ROWS, T.LongType()),
    (OBSERVED, T.LongType()),
    (METRIC, T.StringType()),
    (VALUE, T.LongType()),
)


@dataclass(frozen=True)
class AskedKeys:
    """Per master key column, the distinct join values a step's tuples ask for."""

    values: tuple[tuple[str, pa.Array], ...]

    def row_filter(self) -> pc.Expression:
        """Master rows (their own column names) whose every key is among the asked."""
        condition = pc.field(self.values[0][0]).isin(self.values[0][1])
        for column, asked in self.values[1:]:
            condition = condition & pc.field(column).isin(asked)
        return condition

    def bounds(self) -> dict[str, tuple[Any, Any] | None]:
        """Each integer key's asked range (None: nothing asked of it), for pruning files
        by their log statistics; other keys are not bounded."""
        found: dict[str, tuple[Any, Any] | None] = {}
        for column, asked in self.values:
            if pa.types.is_integer(asked.type):
                if len(asked) == 0:
                    found[column] = None
                else:
                    low, high = pc.min_max(asked).values()
                    found[column] = (low.as_py(), high.as_py())
        return found


@dataclass(frozen=True)
class WideTable:
    """The schema of a stage's step table (and of its state table) and how to fill it."""

    spec: JoinSpec
    stream_schema: T.StructType  # the stream tuple's columns, as H_S keeps them
    master_schema: T.StructType  # the projected master columns

    @classmethod
    def of(cls, spec: JoinSpec, stream: T.StructType, master: T.StructType) -> WideTable:
        missing = [c for c in spec.master_columns if c not in master.fieldNames()]
        if missing:
            raise ValueError(f"master has no columns {missing}: it has {master.fieldNames()}")
        projected = T.StructType([master[c] for c in spec.master_columns])
        return cls(spec, stream, projected)

    @property
    def layout(self) -> WideLayout:
        return WideLayout(
            tuple(self.stream_schema.fieldNames()),
            self.spec.master_columns,
            self.spec.stream_keys,
            self.spec.master_keys,
        )

    @property
    def schema(self) -> T.StructType:
        fields = [T.StructField(ROLE, T.StringType(), False)]
        fields += [
            T.StructField(stream_field(f.name), f.dataType, True) for f in self.stream_schema
        ]
        fields += [
            T.StructField(master_field(f.name), f.dataType, True) for f in self.master_schema
        ]
        fields += [T.StructField(name, kind, True) for name, kind in _OPERATOR_FIELDS]
        return T.StructType(fields)

    def plan_positions(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Positions of the join values in a stream tuple and a master row, as the buckets
        decode them (``joins.ssbj.buckets``)."""
        layout = self.layout
        return layout.stream_key_positions, layout.master_key_positions

    # The builders below lay rows out with SQL expression strings, one ``selectExpr`` per
    # frame: a Column per wide field costs several JVM round trips in a classic session,
    # and a step builds a few hundred of them (0.13 s a frame against 0.02 s, measured).

    def _fill(self, frame: DataFrame, role: str, given: dict[str, str]) -> DataFrame:
        """``frame`` as rows of ``role``: each wide field from its SQL expression in
        ``given``, the others null."""
        columns = [f"{string_literal(role)} AS {quoted_identifier(ROLE)}"]
        for f in self.schema.fields[1:]:
            columns.append(_cast(given.get(f.name, "NULL"), f))
        return frame.selectExpr(*columns)

    def stream_rows(self, frame: DataFrame, role: str = NEW) -> DataFrame:
        """New stream tuples (their columns named as in ``stream_schema``)."""
        return self._fill(
            frame,
            role,
            {stream_field(c): quoted_identifier(c) for c in self.stream_schema.fieldNames()},
        )

    def master_rows(
        self, frame: DataFrame, role: str, extra: dict[str, str] | None = None
    ) -> DataFrame:
        """Master rows (projected columns) in ``role``, with ``extra`` operator columns
        (SQL expressions)."""
        given = {master_field(c): quoted_identifier(c) for c in self.spec.master_columns}
        return self._fill(frame, role, given | (extra or {}))

    def partition_rows(self, frame: DataFrame, version: int) -> DataFrame:
        return self.master_rows(frame, PARTITION, {VERSION: str(int(version))})

    def change_rows(self, changes: DataFrame, change_type: str, for_switch: bool) -> DataFrame:
        """Rows a master's commits changed: removed (delete, update pre-image) or added."""
        kind = quoted_identifier(change_type)
        removed = ", ".join(string_literal(c) for c in REMOVED_CHANGES)
        added = ", ".join(string_literal(c) for c in ADDED_CHANGES)
        change = (
            f"CASE WHEN {kind} IN ({removed}) THEN {string_literal(REMOVED)} "
            f"WHEN {kind} IN ({added}) THEN {string_literal(ADDED)} END"
        )
        role = SWITCH_CHANGE if for_switch else CACHE_CHANGE
        return self.master_rows(changes, role, {CHANGE: change}).where(F.col(CHANGE).isNotNull())

    def reload_rows(self, frame: DataFrame) -> DataFrame:
        return self.master_rows(frame, RELOAD)

    def state_rows(self, state: DataFrame) -> DataFrame:
        """The state table's rows laid out as this step's wide table (columns by name)."""
        present = set(state.columns)
        return state.selectExpr(
            *[
                _cast(quoted_identifier(f.name) if f.name in present else "NULL", f)
                for f in self.schema
            ]
        )

    def _join_values(self) -> list[Column]:
        """A row's join value, the same for a stream tuple and a master row.

        Stream join columns are cast to the master's types, so equal join values hash and
        compare alike whatever the two sides' integer widths. Floating values are
        normalised as Spark's own joins do (every NaN one NaN, -0.0 as 0.0): the bucket is a
        hash of the value's bits, and values the join calls equal must meet in one bucket."""
        by_stream = F.col(ROLE).isin(*STREAM_ROLES)
        values = []
        for i, (s, m) in enumerate(zip(self.spec.stream_keys, self.spec.master_keys, strict=True)):
            data_type = self.master_schema[m].dataType
            value = F.when(by_stream, F.col(stream_field(s)).cast(data_type)).otherwise(
                F.col(master_field(m))
            )
            if isinstance(data_type, T.FloatType | T.DoubleType):
                value = (
                    F.when(F.isnan(value), F.lit(float("nan")).cast(data_type))
                    .when(value == 0, F.lit(0.0).cast(data_type))
                    .otherwise(value)
                )
            values.append(value.alias(f"_join_value_{i}"))
        return values

    @property
    def step_schema(self) -> T.StructType:
        """A step's result: the state's columns, then where each bucket's load came from."""
        return T.StructType(
            [
                *self.schema.fields,
                T.StructField(BUCKET, T.IntegerType(), True),
                T.StructField(KEY_HASH, T.LongType(), True),
                T.StructField(STORED, T.LongType(), True),
                T.StructField(PROBES, T.LongType(), True),
                T.StructField(SKETCH, T.BinaryType(), True),
            ]
        )

    def step(self, keyed: DataFrame, function: Callable[[pa.Table], pa.Table]) -> DataFrame:
        """One step of every bucket: enriched rows, new state, counters and loads, one pass.

        The rows of :meth:`keyed_rows`, grouped by bucket, each group through ``function``
        (:meth:`bucket_function`) in a Spark task; :meth:`step_in_driver` runs the same
        groups in the driver."""
        # A plain one-argument function: applyInArrow reads the function's arguments to
        # tell ``f(table)`` from ``f(key, table)``, and would count a callable's ``self``.
        return keyed.groupBy(BUCKET).applyInArrow(
            lambda table: function(table),  # noqa: PLW0108 - see above
            self.step_schema,
        )

    def keyed_rows(
        self,
        inputs: Sequence[DataFrame],
        partitions: Sequence[DataFrame],
        routing: KeyRouting,
        semi_join: bool = True,
    ) -> DataFrame:
        """A step's wide rows, each with its join value's hash and its bucket's label.

        ``partitions`` are the master partition rows (``partition_rows``). With
        ``semi_join``, only the rows whose join value a new tuple, a pending tuple or s_B
        asks for reach the buckets (a semi-join before the shuffle: the rest can match
        nothing this step, so a step ships the probed share of |R|/k, not all of it, for
        the price of one more job); without, every row does, and each bucket drops the
        rows it has no use for (``joins.ssbj.buckets``). Every row is placed by
        ``routing`` (a split key's replicated rows once per bucket of the key)."""
        union = _union(inputs)
        values = self._join_values()
        names = [f"_join_value_{i}" for i in range(len(values))]
        if partitions and semi_join:
            asked = union.where(F.col(ROLE).isin(*ASKING_ROLES)).select(*values).distinct()
            met = _union(partitions).select("*", *values).join(asked, names, "left_semi")
            union = union.unionByName(met.drop(*names))
        elif partitions:
            union = union.unionByName(_union(partitions))
        keyed = union.withColumn(KEY_HASH, F.xxhash64(*values))
        if routing.split:
            tuple_hash = F.xxhash64(*[F.col(c) for c in self.layout.stream_fields])
            labels = bucket_labels(F.col(KEY_HASH), F.col(ROLE), tuple_hash, routing)
            return keyed.withColumn(BUCKET, F.explode(labels))
        return keyed.withColumn(BUCKET, bucket_label(F.col(KEY_HASH), routing))

    # The same layout in the driver's memory, for a step that runs there on an engine
    # whose reads need no Spark (``pipeline.ssbj.step_pass``): the rows :meth:`keyed_rows`
    # would give for the same inputs, with the same key hashes (``joins.ssbj.spark_hash``).

    def _fill_arrow(self, rows: pa.Table, role: str, given: dict[str, pa.Array]) -> pa.Table:
        """:meth:`_fill` of rows in memory: each wide field from ``given``, else null."""
        schema = spark_to_arrow(self.schema)
        count = rows.num_rows
        columns: list[pa.Array | pa.ChunkedArray] = [pa.repeat(pa.scalar(role, pa.string()), count)]
        for field in list(schema)[1:]:
            value = given.get(field.name)
            columns.append(pa.nulls(count, field.type) if value is None else value.cast(field.type))
        return pa.Table.from_arrays(columns, schema=schema)

    def stream_rows_arrow(self, rows: pa.Table, role: str = NEW) -> pa.Table:
        """:meth:`stream_rows` of rows in memory."""
        return self._fill_arrow(
            rows, role, {stream_field(c): rows.column(c) for c in self.stream_schema.fieldNames()}
        )

    def partition_rows_arrow(self, rows: pa.Table, version: int) -> pa.Table:
        """:meth:`partition_rows` of rows in memory."""
        given = {master_field(c): rows.column(c) for c in self.spec.master_columns}
        given[VERSION] = pa.repeat(pa.scalar(int(version), pa.int64()), rows.num_rows)
        return self._fill_arrow(rows, PARTITION, given)

    def state_rows_arrow(self, state: pa.Table) -> pa.Table:
        """:meth:`state_rows` of a state table read into memory (columns by name)."""
        schema = spark_to_arrow(self.schema)
        present = set(state.column_names)
        return pa.Table.from_arrays(
            [
                state.column(f.name).cast(f.type)
                if f.name in present
                else pa.nulls(state.num_rows, f.type)
                for f in schema
            ],
            schema=schema,
        )

    def arrow_keys_supported(self) -> bool:
        """Whether :meth:`keyed_rows_arrow` computes this stage's join values exactly as
        :meth:`keyed_rows` does: each stream key of the master key's type, or an integer
        that widens to it, and a master key type :mod:`joins.ssbj.spark_hash` hashes."""
        for s, m in zip(self.spec.stream_keys, self.spec.master_keys, strict=True):
            stream = spark_to_arrow(T.StructType([self.stream_schema[s]])).field(0).type
            master = spark_to_arrow(T.StructType([self.master_schema[m]])).field(0).type
            if not spark_hash.supports(master):
                return False
            widens = (
                pa.types.is_integer(stream)
                and pa.types.is_integer(master)
                and stream.bit_width <= master.bit_width
            )
            if stream != master and not widens:
                return False
        return True

    def _join_values_arrow(self, rows: pa.Table) -> list[pa.Array | pa.ChunkedArray]:
        """:meth:`_join_values` of rows in memory (floating values are normalised by the
        hash, :mod:`joins.ssbj.spark_hash`, as Spark's are before it)."""
        by_stream = pc.is_in(rows.column(ROLE), value_set=pa.array(STREAM_ROLES, pa.string()))
        values = []
        for s, m in zip(self.spec.stream_keys, self.spec.master_keys, strict=True):
            master = rows.column(master_field(m))
            stream = rows.column(stream_field(s)).cast(master.type)
            values.append(pc.if_else(by_stream, stream, master))
        return values

    def asked_keys(self, inputs: Sequence[pa.Table]) -> AskedKeys | None:
        """The join values a new tuple, a pending tuple or s_B asks for this step, per
        master key column: a superset of the master rows a semi-join keeps (the buckets
        compare whole values). None where a key is floating (-0.0 and 0.0 are one join
        value, but two to Arrow's ``is_in``): those partitions are read whole."""
        # Only the role and key columns: the rows' other columns need not be copied.
        # Two stream keys may join one master column: each column once.
        columns = list(
            dict.fromkeys(
                [
                    ROLE,
                    *(stream_field(s) for s in self.spec.stream_keys),
                    *(master_field(m) for m in self.spec.master_keys),
                ]
            )
        )
        union = pa.concat_tables([table.select(columns) for table in inputs])
        asking = union.filter(
            pc.is_in(union.column(ROLE), value_set=pa.array(ASKING_ROLES, pa.string()))
        )
        asked = []
        for m, values in zip(self.spec.master_keys, self._join_values_arrow(asking), strict=True):
            if pa.types.is_floating(values.type):
                return None
            asked.append((m, pc.unique(values).drop_null()))
        return AskedKeys(tuple(asked))

    def keyed_rows_arrow(
        self, inputs: Sequence[pa.Table], partitions: Sequence[pa.Table], routing: KeyRouting
    ) -> pa.Table:
        """:meth:`keyed_rows` without the semi-join (the buckets drop the master rows no
        tuple asks for) of rows in memory, for a stage whose keys
        :meth:`arrow_keys_supported` and a routing without split keys."""
        if routing.split:
            raise ValueError("keyed_rows_arrow: split keys are routed on Spark")
        union = pa.concat_tables([*inputs, *partitions])
        hashes = spark_hash.xxhash64(self._join_values_arrow(union))
        labels = task_labels(routing.buckets)
        owners = np.mod(hashes.to_numpy(), routing.buckets)
        for key_hash, bucket in routing.moved:
            owners[hashes.to_numpy() == key_hash] = bucket
        buckets = pa.array(np.asarray(labels, dtype=np.int32)[owners], pa.int32())
        return union.append_column(KEY_HASH, hashes).append_column(BUCKET, buckets)

    def bucket_function(
        self,
        plan: StepPlan,
        deltas: BucketDeltas,
        routing: KeyRouting,
        top_keys: int = 16,
        tracked: Sequence[int] | None = None,
        sketch: SketchShape | None = None,
        late: LateRule | None = None,
    ) -> BucketStep:
        """Algorithm 1 over one bucket's rows. Each bucket reports its ``top_keys`` heaviest
        keys; with ``sketch``, only the ``tracked`` key hashes are instrumented and each
        bucket reports an ASketch of its new tuples; ``late`` keeps the tuples no master
        row answered waiting (``joins.ssbj.buckets.bucket_step``)."""
        label_of = task_labels(routing.buckets)
        owners = {h: label_of[routing.bucket(h)] for h, _ in routing.split}
        ways = {h: 1 + len(replicas) for h, replicas in routing.split}
        return bucket_function(
            self.layout, plan, deltas, top_keys, owners, tracked, sketch, ways, late
        )

    def step_in_driver(
        self, keyed: pa.Table, function: BucketStep, partitions_asked: bool = False
    ) -> pa.Table:
        """:meth:`step`'s result from :meth:`keyed_rows` collected into the driver, with
        the step's Arrow schema: every bucket at once where the columnar pass can
        (``BucketStep.all_buckets``), else each bucket's rows through ``function`` here,
        as the Spark tasks would run them (the same groups, so the same result).
        ``partitions_asked``: see ``BucketStep.all_buckets``."""
        schema = spark_to_arrow(self.step_schema)
        whole = function.all_buckets(keyed, partitions_asked)
        if whole is not None:
            return whole.select(schema.names).cast(schema)
        labels = keyed.column(BUCKET)
        results = [
            function(keyed.filter(pc.equal(labels, label)))
            for label in pc.unique(labels).to_pylist()
        ]
        if not results:
            return schema.empty_table()
        return pa.concat_tables([r.select(schema.names).cast(schema) for r in results])

    def _output_columns(self) -> list[tuple[str, str]]:
        """(step result column, output column) of every column of the stage's output."""
        stream = [c for c in self.stream_schema.fieldNames() if c != INPUT_VERSION]
        return [
            *[(stream_field(c), c) for c in stream],
            *[(master_field(c), c) for c in self.spec.master_columns],
            (VERSION, self.spec.version),
        ]

    def enriched(self, result: DataFrame) -> DataFrame:
        """The step's output rows, laid out as the stage's output table."""
        return result.where(F.col(ROLE) == OUT).selectExpr(
            *[
                f"{quoted_identifier(field)} AS {quoted_identifier(name)}"
                for field, name in self._output_columns()
            ]
        )

    def enriched_arrow(self, result: pa.Table) -> pa.Table:
        """:meth:`enriched` of a step result collected as Arrow."""
        rows = rows_where(result, pc.equal(result.column(ROLE), OUT))  # the result's first run
        columns = self._output_columns()
        return pa.table([rows.column(f) for f, _ in columns], names=[n for _, n in columns])


def _cast(expression: str, field: T.StructField) -> str:
    return (
        f"CAST({expression} AS {field.dataType.simpleString()}) AS {quoted_identifier(field.name)}"
    )


def _owner(key_hash: Column, routing: KeyRouting) -> Column:
    """The bucket that holds a key's state: moved (a literal map) or at home."""
    home = F.pmod(key_hash, F.lit(routing.buckets))
    if not routing.moved:
        return home
    hashes = ",".join(f"{h}L" for h, _ in routing.moved)
    targets = ",".join(str(b) for _, b in routing.moved)
    moved = F.expr(f"map_from_arrays(array({hashes}), array({targets}))")
    return F.coalesce(F.try_element_at(moved, key_hash), home)


def _labels(routing: KeyRouting) -> Column:
    return F.expr(f"array({','.join(str(label) for label in task_labels(routing.buckets))})")


def bucket_label(key_hash: Column, routing: KeyRouting) -> Column:
    """The group label of a key's owner bucket under ``routing``, labelled so that Spark's
    hash partitioning puts bucket ``b`` in task ``b`` (``task_labels``).

    Both lookups are SQL literals (a map of the moved keys, an array of labels): constant
    data in the plan, no join and no broadcast."""
    bucket = _owner(key_hash, routing)
    return F.element_at(_labels(routing), (bucket + 1).cast(T.IntegerType())).cast(T.IntegerType())


# Rows a replica of a split key needs beside its share of the new tuples: the key's cache
# entry and the master's changes to it (cache phase), the master partition rows (disk
# phase, for the tuples that miss the replica's copy of the cache), and s_B with its
# changes: at a phase-out step s_B becomes the cache, and a replica without the copy would
# send its share of the key's new tuples to H_S for a whole R-cycle (measured: 53% of
# tuples answered by the cache at z = 2 with splitting against 66.5% without).
REPLICATED_ROLES = (CACHE, CACHE_CHANGE, RELOAD, PARTITION, MARKED, SWITCH, SWITCH_CHANGE)


def bucket_labels(
    key_hash: Column, role: Column, tuple_hash: Column, routing: KeyRouting
) -> Column:
    """The labels of every bucket a row goes to (an array, to explode): the owner's, except
    for split keys (``KeyRouting.split``), whose stream tuples (new and pending) go to one
    of the key's buckets by ``tuple_hash`` and whose :data:`REPLICATED_ROLES` rows go to
    all of them. A pending tuple stays in its bucket while the key's buckets stay the same;
    in any bucket it meets the partition, which every bucket of the key receives."""
    owner = _owner(key_hash, routing)
    hashes = ",".join(f"{h}L" for h, _ in routing.split)
    replicas = ",".join(f"array({','.join(str(b) for b in r)})" for _, r in routing.split)
    split = F.try_element_at(
        F.expr(f"map_from_arrays(array({hashes}), array({replicas}))"), key_hash
    )
    every = F.concat(F.array(owner), split)
    pick = F.element_at(every, (F.pmod(tuple_hash, F.size(every)) + 1).cast(T.IntegerType()))
    buckets = (
        F.when(split.isNull(), F.array(owner))
        .when(role.isin(*STREAM_ROLES), F.array(pick))
        .when(role.isin(*REPLICATED_ROLES), every)
        .otherwise(F.array(owner))
    )
    labels = _labels(routing)
    return F.transform(
        buckets, lambda b: F.element_at(labels, (b + 1).cast(T.IntegerType())).cast("int")
    )


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


_LOAD_COLUMNS = (BUCKET, KEY_HASH, STORED, PROBES, SKETCH)
_SUMMARY_COLUMNS = (ROLE, METRIC, VALUE, BUCKET, KEY_HASH, STORED, PROBES, SKETCH)


def state_of(result: DataFrame, segmented: bool = False) -> DataFrame:
    """The new operator state in a step's result (without the load columns); with
    ``segmented``, each row's ``_segment`` (``joins.ssbj.segments``) after them."""
    state = result.where(F.col(ROLE).isin(*STATE_ROLES)).drop(*_LOAD_COLUMNS)
    if not segmented:
        return state
    segment = F.when(F.col(ROLE) == F.lit(PENDING), F.col(ENTRY_STEP).cast("long"))
    for role, value in SHARED_SEGMENTS.items():
        segment = segment.when(F.col(ROLE) == F.lit(role), F.lit(value).cast("long"))
    return state.withColumn(SEGMENT, segment)


def state_of_arrow(result: pa.Table) -> pa.Table:
    """:func:`state_of` of a step result collected as Arrow."""
    kept = rows_where(result, pc.is_in(result.column(ROLE), pa.array(list(STATE_ROLES))))
    return kept.drop_columns(list(_LOAD_COLUMNS))


def summary_rows_arrow(result: pa.Table) -> list[tuple[Any, ...]]:
    """:func:`summary_of`'s rows from a step result collected as Arrow."""
    roles = pa.array([METRIC_ROLE, KEY_LOAD, KEY_SKETCH])
    # The summary rows are the result's last runs (slices, no copy), and few: read by
    # column, not as a dict per row.
    kept = rows_where(result.select(list(_SUMMARY_COLUMNS)), pc.is_in(result.column(ROLE), roles))
    return list(zip(*(column.to_pylist() for column in kept.columns), strict=True))


def bucket_loads(
    rows: Sequence[tuple[int, int | None, int, int]], buckets: int
) -> list[BucketLoad]:
    """Each bucket's load from its ``key_load`` rows ``(label, key hash, stored, probes)``:
    the row with no hash holds its totals, the others its heaviest keys."""
    bucket_of = {label: b for b, label in enumerate(task_labels(buckets))}
    totals: dict[int, tuple[int, int]] = {}
    keys: dict[int, list[KeyLoad]] = {}
    for label, key_hash, stored, probes in rows:
        if label not in bucket_of:
            raise ValueError(f"a load row of bucket label {label}: not one of {buckets} buckets")
        bucket = bucket_of[label]
        if key_hash is None:
            totals[bucket] = (int(stored), int(probes))
        else:
            keys.setdefault(bucket, []).append(KeyLoad(int(key_hash), int(stored), int(probes)))
    return [
        BucketLoad(b, stored, probes, tuple(keys.get(b, ())))
        for b, (stored, probes) in sorted(totals.items())
    ]


def summary_of(result: DataFrame) -> DataFrame:
    """The step's counters and the buckets' loads, for one collect on the driver.

    Rows ``(role, name, value, label, key hash, stored, probes, sketch)``: role ``metric``
    rows are counters (a few per bucket: the driver sums them, which spares the step a
    shuffle), role ``key_load`` rows are loads (``joins.ssbj.buckets.key_loads``, read by
    :func:`bucket_loads`), role ``key_sketch`` rows the buckets' key sketches."""
    return result.where(F.col(ROLE).isin(METRIC_ROLE, KEY_LOAD, KEY_SKETCH)).select(
        *_SUMMARY_COLUMNS
    )


def pending_tuples(state: DataFrame) -> DataFrame:
    """The tuples a state table holds unanswered, H_S and the late rows: the stream
    tuples (their own names), their entry step (null for a late row) and
    :data:`WAITING_SINCE`, when a tuple that waits for a late master row first met none
    (null for the others)."""
    prefix = stream_field("")
    stream = [c for c in state.columns if c.startswith(prefix)]
    return state.where(F.col(ROLE).isin(PENDING, LATE)).select(
        *[F.col(c).alias(c[len(prefix) :]) for c in stream],
        F.col(ENTRY_STEP),
        F.timestamp_micros(F.col(LATE_SINCE)).alias(WAITING_SINCE),
    )


def pending_tuples_arrow(state: pa.Table) -> pa.Table:
    """:func:`pending_tuples` of a state table read into the driver."""
    prefix = stream_field("")
    stream = [c for c in state.column_names if c.startswith(prefix)]
    rows = state.filter(pc.is_in(state.column(ROLE), pa.array([PENDING, LATE])))
    since = rows.column(LATE_SINCE).cast(pa.int64()).cast(pa.timestamp("us", "UTC"))
    return pa.table(
        [*[rows.column(c) for c in stream], rows.column(ENTRY_STEP), since],
        names=[*[c[len(prefix) :] for c in stream], ENTRY_STEP, WAITING_SINCE],
    )


def cache_entries(state: DataFrame, spec: JoinSpec) -> DataFrame:
    """H_R from a state table: master rows (their own names) and the empty-entry marker."""
    return state.where(F.col(ROLE) == CACHE).select(
        *[F.col(master_field(c)).alias(c) for c in spec.master_columns], F.col(EMPTY)
    )
