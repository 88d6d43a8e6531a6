"""The audit views a suite's SQL expectations read beside the staged batch.

A staged batch alone cannot show a tuple that vanished: it is simply not there. So the
audit also registers two views, built here as pure transforms:

``audit_input``    one row per stream tuple that entered the stage since the last audit:
                   ``tuple_id`` and ``must_emit`` (false only where an inner join may
                   legitimately emit nothing for it);
                   Tuples that were still pending at the last audit are included again,
                   since they must be accounted for now;
``audit_pending``  one row per tuple still waiting in the operator's state: ``tuple_id``,
                   ``age_steps`` (steps since it entered) and ``max_age_steps`` (the
                   stage's maximum delay: one R-cycle of k steps for SSBJ);
``audit_published`` ids of already-published rows of the tuples that were pending at the
                   last audit (a left-join tuple matched in an earlier step and expired
                   now has nothing left to emit).

Row conservation is then a query: every ``audit_input`` tuple with ``must_emit`` is in the
batch, in ``audit_pending`` or in ``audit_published``. Freshness: no ``audit_pending`` row
has ``age_steps > max_age_steps``. See ``expectations/*.json`` for the suites using them.

Each view has two builders with one contract: Spark transforms (a batch validated on Spark,
a backfill) and Arrow tables computed by an in-process DuckDB (``*_arrow``: a batch
validated in the driver's memory, ``quality.batch_engine``), where the Spark frames would
each cost a Spark job to collect (0.05-0.35 s apiece, nine per demo interval, measured).
``tests/quality/test_audit_views.py`` checks that both give the same rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.columns import INTERVAL_START

INPUT_VIEW = "audit_input"
PENDING_VIEW = "audit_pending"
PUBLISHED_VIEW = "audit_published"
TUPLE_ID = "tuple_id"
MUST_EMIT = "must_emit"
AGE_STEPS = "age_steps"
MAX_AGE_STEPS = "max_age_steps"

_MATCHED = "_audit_has_match"


def input_accounting(
    new_input: DataFrame,
    id_column: str,
    must_emit_all: bool,
    master_keys: DataFrame | None = None,
    join_on: Mapping[str, str] | None = None,
) -> DataFrame:
    """``audit_input`` rows for ``new_input``.

    ``must_emit_all`` holds for left joins. For an inner equi join pass the master's key
    columns and the stream-to-master column mapping: a tuple must be emitted exactly when
    its key exists in the master. Otherwise (inner theta) no tuple is required.
    """
    if must_emit_all:
        flagged = new_input.select(F.col(id_column).alias(TUPLE_ID), F.lit(True).alias(MUST_EMIT))
    elif master_keys is not None and join_on:
        keys = master_keys.select(*join_on.values()).distinct().withColumn(_MATCHED, F.lit(True))
        condition = [new_input[s] == keys[m] for s, m in join_on.items()]
        flagged = new_input.join(keys, condition, "left").select(
            F.col(id_column).alias(TUPLE_ID),
            F.coalesce(F.col(_MATCHED), F.lit(False)).alias(MUST_EMIT),
        )
    else:
        flagged = new_input.select(F.col(id_column).alias(TUPLE_ID), F.lit(False).alias(MUST_EMIT))
    return flagged.groupBy(TUPLE_ID).agg(F.max(MUST_EMIT).alias(MUST_EMIT))


def pending_ages(
    pending: DataFrame, id_column: str, entry_step_column: str, next_step: int, max_age_steps: int
) -> DataFrame:
    """``audit_pending`` rows: how many steps each waiting tuple has waited."""
    return pending.select(
        F.col(id_column).alias(TUPLE_ID),
        (F.lit(next_step) - F.col(entry_step_column)).cast(T.LongType()).alias(AGE_STEPS),
        F.lit(max_age_steps).cast(T.LongType()).alias(MAX_AGE_STEPS),
    )


def no_pending(spark: SparkSession, id_type: T.DataType) -> DataFrame:
    schema = T.StructType(
        [
            T.StructField(TUPLE_ID, id_type),
            T.StructField(AGE_STEPS, T.LongType()),
            T.StructField(MAX_AGE_STEPS, T.LongType()),
        ]
    )
    return spark.createDataFrame([], schema)


def published_tuples(published: DataFrame, waiting: DataFrame, id_column: str) -> DataFrame:
    """``audit_published``: ids in ``published`` of the ``waiting`` tuples.

    Only the interval partitions the waiting tuples came from are scanned.
    """
    if INTERVAL_START in waiting.columns and INTERVAL_START in published.columns:
        oldest = waiting.agg(F.min(INTERVAL_START).alias("oldest"))
        published = published.join(
            F.broadcast(oldest), published[INTERVAL_START] >= oldest["oldest"]
        )
    ids = waiting.select(F.col(id_column).alias(TUPLE_ID)).distinct()
    return (
        published.select(F.col(id_column).alias(TUPLE_ID))
        .join(ids, TUPLE_ID, "left_semi")
        .distinct()
    )


def no_published(spark: SparkSession, id_type: T.DataType) -> DataFrame:
    return spark.createDataFrame([], T.StructType([T.StructField(TUPLE_ID, id_type)]))


# ---------------------------------------------------------------- in the driver (Arrow)


def _sql(query: str, params: Mapping[str, Any] | None = None, **relations: pa.Table) -> pa.Table:
    """``query`` (DuckDB SQL, with ``$name`` parameters) over ``relations`` (Arrow tables,
    by name), in UTC like the pipeline's Spark sessions."""
    connection = duckdb.connect()
    try:
        connection.execute("SET TimeZone = 'UTC'")
        for name, table in relations.items():
            connection.register(name, table)
        return connection.sql(query, params=dict(params or {})).to_arrow_table()
    finally:
        connection.close()


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _typed(table: pa.Table, types: Mapping[str, pa.DataType]) -> pa.Table:
    """``table`` with its columns cast to ``types`` (DuckDB's integer and boolean results
    are already these; a tuple id keeps its input type)."""
    return pa.table({n: table.column(n).cast(t) for n, t in types.items()})


def input_accounting_arrow(
    new_input: pa.Table,
    id_column: str,
    must_emit_all: bool,
    master_keys: pa.Table | None = None,
    join_on: Mapping[str, str] | None = None,
) -> pa.Table:
    """:func:`input_accounting` in the driver: ``master_keys`` holds the master's key
    columns (named as in the master)."""
    id_type = new_input.schema.field(id_column).type
    if master_keys is not None and join_on and not must_emit_all:
        keys = ", ".join(_q(m) for m in join_on.values())
        condition = " AND ".join(f"t.{_q(s)} = k.{_q(m)}" for s, m in join_on.items())
        query = (
            f"SELECT t.{_q(id_column)} AS {TUPLE_ID}, bool_or(k._matched IS NOT NULL) AS "
            f"{MUST_EMIT} FROM tuples t LEFT JOIN (SELECT DISTINCT {keys}, TRUE AS _matched "
            f"FROM master_keys) k ON {condition} GROUP BY 1"
        )
        found = _sql(query, None, tuples=new_input, master_keys=master_keys)
    else:
        query = (
            f"SELECT {_q(id_column)} AS {TUPLE_ID}, {str(must_emit_all).upper()} AS "
            f"{MUST_EMIT} FROM tuples GROUP BY 1"
        )
        found = _sql(query, None, tuples=new_input.select([id_column]))
    return _typed(found, {TUPLE_ID: id_type, MUST_EMIT: pa.bool_()})


def union_accounting_arrow(first: pa.Table, second: pa.Table) -> pa.Table:
    """Two ``audit_input`` tables as one (a tuple in both keeps both rows, as Spark's
    ``unionByName`` of the two views does)."""
    return pa.concat_tables([first, second.cast(first.schema)])


def pending_ages_arrow(
    pending: pa.Table, id_column: str, entry_step_column: str, next_step: int, max_age_steps: int
) -> pa.Table:
    """:func:`pending_ages` in the driver."""
    entry = pending.column(entry_step_column).cast(pa.int64())
    return pa.table(
        {
            TUPLE_ID: pending.column(id_column),
            AGE_STEPS: pc.subtract(pa.scalar(next_step, pa.int64()), entry),
            MAX_AGE_STEPS: pa.array([max_age_steps] * pending.num_rows, pa.int64()),
        }
    )


def no_pending_arrow(id_type: pa.DataType) -> pa.Table:
    schema = pa.schema([(TUPLE_ID, id_type), (AGE_STEPS, pa.int64()), (MAX_AGE_STEPS, pa.int64())])
    return schema.empty_table()


def no_published_arrow(id_type: pa.DataType) -> pa.Table:
    return pa.schema([(TUPLE_ID, id_type)]).empty_table()


def oldest_interval_arrow(tuples: Sequence[pa.Table]) -> datetime | None:
    """The oldest ``_interval_start`` of ``tuples`` (None when they hold no interval)."""
    found: Any = None
    for table in tuples:
        if INTERVAL_START not in table.column_names or table.num_rows == 0:
            continue
        low = pc.min(table.column(INTERVAL_START)).as_py()
        if low is not None and (found is None or low < found):
            found = low
    return found


def published_tuples_arrow(
    published: pa.Table, waiting: pa.Table, id_column: str, oldest: datetime | None
) -> pa.Table:
    """:func:`published_tuples` in the driver; ``oldest`` is the oldest interval of
    ``waiting`` (:func:`oldest_interval_arrow`), None to read every row of ``published``."""
    id_type = waiting.schema.field(id_column).type
    since = ""
    if oldest is not None and INTERVAL_START in published.column_names:
        since = f"WHERE p.{_q(INTERVAL_START)} >= $oldest"
    query = (
        f"SELECT DISTINCT p.{_q(id_column)} AS {TUPLE_ID} FROM published p {since} "
        f"{'AND' if since else 'WHERE'} p.{_q(id_column)} IN (SELECT {_q(id_column)} FROM waiting)"
    )
    found = _sql(
        query,
        {"oldest": oldest} if since else None,
        published=published,
        waiting=waiting.select([id_column]),
    )
    return _typed(found, {TUPLE_ID: id_type})
