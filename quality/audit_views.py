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
"""

from __future__ import annotations

from collections.abc import Mapping

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
