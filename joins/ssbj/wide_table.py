"""The wide table of one SSBJ step: its new stream tuples, the operator's state, the master
partitions it needs and the master's changes, laid out as one table in the columns of
:func:`joins.ssbj.step` (stream ``s__*``, master ``r__*``, operator fields), keyed by the
join value's hash and labelled with the bucket each row goes to
(:mod:`joins.ssbj.bucket_routing`), for the ``groupBy(bucket).applyInArrow`` pass of
:mod:`joins.ssbj.buckets`.

Each input is laid out once, whether it is a Spark frame or an Arrow table in the driver
(a step the placement runs there): the fields' sources are stated once and applied as one
``selectExpr`` or one ``Table.from_arrays``. The keys and buckets are computed twice, by
design: :meth:`WideTable.keyed_rows` with Spark's semi-join and ``xxhash64``,
:meth:`WideTable.keyed_rows_arrow` with :mod:`joins.ssbj.spark_hash` reproducing that hash
bit for bit, so a row lands in the bucket a Spark task would give it
(``tests/joins/ssbj/test_keyed_rows.py`` holds the two to the same rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.rows import Native, rows_where
from common.sql_text import quoted_identifier, string_literal
from joins.asked_keys import AskedKeys, AskedValues
from joins.skew.asketch import SketchShape
from joins.skew.key_routing import KeyRouting, task_labels
from joins.ssbj import spark_hash
from joins.ssbj.algorithm import StepPlan
from joins.ssbj.bucket_decode import BucketDeltas, WideLayout
from joins.ssbj.bucket_routing import bucket_label, bucket_labels
from joins.ssbj.buckets import BucketStep
from joins.ssbj.late import LateRule
from joins.ssbj.roles import (
    ADDED,
    ASKING_ROLES,
    BUCKET,
    CACHE_CHANGE,
    CHANGE,
    EMPTY,
    ENTRY_STEP,
    HITS,
    KEY_HASH,
    MASTER_ROWS,
    MATCHED,
    METRIC,
    NEW,
    OBSERVED,
    OUT,
    PARTITION,
    PINNED_VERSION,
    PROBES,
    RELOAD,
    REMOVED,
    ROLE,
    SKETCH,
    STORED,
    STREAM_ROLES,
    SWITCH_CHANGE,
    VALUE,
    VERSION,
    master_field,
    stream_field,
)
from joins.ssbj.step import INPUT_VERSION, JoinSpec
from warehouse.delta.api import ADDED_CHANGES, REMOVED_CHANGES
from warehouse.delta.schema import spark_to_arrow

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

    def _fill_sql(self, frame: DataFrame, given: dict[str, str]) -> DataFrame:
        """``frame`` as wide rows: each field from its SQL expression in ``given``, the
        others null."""
        return frame.selectExpr(*[_cast(given.get(f.name, "NULL"), f) for f in self.schema])

    def _lay_out(self, rows: Native, given: Mapping[str, str | _Constant]) -> Native:
        """``rows`` (a Spark frame or an Arrow table) as wide rows: each field of
        :attr:`schema` from its source in ``given`` (a column of ``rows``, or a constant),
        cast to the field's type; the others null."""
        if not isinstance(rows, pa.Table):
            return self._fill_sql(rows, {name: _sql(source) for name, source in given.items()})
        schema = spark_to_arrow(self.schema)
        count = rows.num_rows
        columns: list[pa.Array | pa.ChunkedArray] = []
        for field in schema:
            source = given.get(field.name)
            if source is None:
                columns.append(pa.nulls(count, field.type))
            elif isinstance(source, _Constant):
                columns.append(pa.repeat(pa.scalar(source.value, field.type), count))
            else:
                columns.append(rows.column(source).cast(field.type))
        return pa.Table.from_arrays(columns, schema=schema)

    def stream_rows(self, rows: Native, role: str = NEW) -> Native:
        """New stream tuples (their columns named as in ``stream_schema``)."""
        given: dict[str, str | _Constant] = {ROLE: _Constant(role)}
        given |= {stream_field(c): c for c in self.stream_schema.fieldNames()}
        return self._lay_out(rows, given)

    def master_rows(
        self, frame: DataFrame, role: str, extra: dict[str, str] | None = None
    ) -> DataFrame:
        """Master rows (projected columns) in ``role``, with ``extra`` operator columns
        (SQL expressions)."""
        given = {master_field(c): quoted_identifier(c) for c in self.spec.master_columns}
        return self._fill_sql(frame, {ROLE: string_literal(role)} | given | (extra or {}))

    def partition_rows(self, rows: Native, version: int) -> Native:
        """The rows of a master partition at ``version`` (projected columns)."""
        given: dict[str, str | _Constant] = {ROLE: _Constant(PARTITION)}
        given |= {master_field(c): c for c in self.spec.master_columns}
        return self._lay_out(rows, given | {VERSION: _Constant(int(version))})

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

    def state_rows(self, state: Native) -> Native:
        """The state table's rows laid out as this step's wide table (columns by name)."""
        present = set(state.column_names if isinstance(state, pa.Table) else state.columns)
        return self._lay_out(state, {f: f for f in self.schema.fieldNames() if f in present})

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

    # The keys in the driver's memory, for a step that runs there on an engine whose
    # reads need no Spark (``pipeline.ssbj.placement``): the rows :meth:`keyed_rows` would
    # give for the same inputs, with the same key hashes (``joins.ssbj.spark_hash``).

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
            asked.append(AskedValues.of(m, pc.unique(values).drop_null()))
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
        return BucketStep(self.layout, plan, deltas, top_keys, owners, tracked, sketch, ways, late)

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


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _sql(source: str | _Constant) -> str:
    return source.sql() if isinstance(source, _Constant) else quoted_identifier(source)


@dataclass(frozen=True)
class _Constant:
    """A constant wide field (a role, a partition's version)."""

    value: int | str

    def sql(self) -> str:
        if isinstance(self.value, str):
            return string_literal(self.value)
        return str(int(self.value))
