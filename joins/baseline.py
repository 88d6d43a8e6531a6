"""Baseline enrichment: Spark's own join of each batch against the whole master snapshot.

This is what SSBJ and A-DSP are measured against, and what a stage runs with
``mode: baseline`` (equi) or ``scheme: spark`` (theta). For theta predicates Spark plans a
BroadcastNestedLoopJoin or a cartesian product, so it is only practical for small masters.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.errors import JoinError
from joins.columns import MATCHED, ROW_ID, version_column
from joins.theta.condition import theta_condition
from joins.theta.predicate import ThetaPredicate


def _flagged(master: DataFrame, master_name: str, version: int) -> DataFrame:
    return master.withColumn(MATCHED, F.lit(True)).withColumn(
        version_column(master_name), F.lit(version).cast("bigint")
    )


def equi_join_flagged(
    stream: DataFrame,
    master: DataFrame,
    on: Mapping[str, str],
    master_name: str,
    master_version: int,
    prefilter: bool = False,
) -> DataFrame:
    """Left-join every stream row to its matches; ``_matched`` is false for no match.

    ``prefilter`` first keeps only the master rows whose key the stream holds (a left semi
    join on the stream's distinct keys, which Spark broadcasts), so that the outer join's
    master side is the batch's matches rather than the whole master: a left outer join
    cannot broadcast its stream side, and without it Spark shuffles the whole master for a
    sort-merge join. The result is the same; for a batch much smaller than the master the
    step is faster (BENCHMARKS.md, section 1).
    """
    if prefilter:
        keys = [F.col(s).alias(f"_key{i}") for i, s in enumerate(on)]
        distinct = stream.select(*keys).distinct()
        probe = None
        for i, master_col in enumerate(on.values()):
            term = master[master_col] == distinct[f"_key{i}"]
            probe = term if probe is None else probe & term
        master = master.join(F.broadcast(distinct), probe, "left_semi")
    right = _flagged(master, master_name, master_version)
    condition: Column | None = None
    for stream_col, master_col in on.items():
        term = stream[stream_col] == right[master_col]
        condition = term if condition is None else condition & term
    joined = stream.join(right, condition, "left")
    return joined.withColumn(MATCHED, F.coalesce(F.col(MATCHED), F.lit(False)))


def theta_join_flagged(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    master_name: str,
    master_version: int,
    broadcast: bool = False,
) -> DataFrame:
    """Left-join every stream row to the master rows satisfying the theta predicate;
    ``broadcast`` asks for a broadcast nested loop (a small master, ``scheme: auto``)."""
    right = _flagged(master, master_name, master_version)
    if broadcast:
        right = F.broadcast(right)
    joined = stream.join(right, theta_condition(predicate, stream, right), "left")
    return joined.withColumn(MATCHED, F.coalesce(F.col(MATCHED), F.lit(False)))


def finish(joined: DataFrame, how: str) -> DataFrame:
    """Keep what the join type emits: matches only (inner) or also unmatched rows (left)."""
    kept = joined if how == "left" else joined.where(F.col(MATCHED))
    return kept.drop(MATCHED, ROW_ID)


def binned_band_join_flagged(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    master_name: str,
    master_version: int,
) -> DataFrame:
    """1-DSP range binning: an equi-join on ``floor(key / width)`` with neighbour bins.

    Each master row is replicated to every bin its band can reach, each stream row goes to
    its own bin, then the exact predicate filters the pairs. Only band predicates bin well.
    """
    if predicate.type != "band" or not predicate.master_column:
        raise JoinError(
            f"range binning supports band predicates only, not {predicate.type!r}; "
            "use scheme adsp, square, dynamic or spark"
        )
    lower, upper = predicate.band_bounds()
    width = max(lower + upper, 1e-9)
    key = F.col(predicate.master_column).cast("double")
    right = _flagged(master, master_name, master_version).withColumn(
        "_bin",
        F.explode(
            F.sequence(
                F.floor((key - F.lit(upper)) / F.lit(width)).cast("long"),
                F.floor((key + F.lit(lower)) / F.lit(width)).cast("long"),
            )
        ),
    )
    left = stream.withColumn(
        "_bin", F.floor(F.col(predicate.stream_column).cast("double") / F.lit(width)).cast("long")
    )
    condition = (left["_bin"] == right["_bin"]) & theta_condition(predicate, left, right)
    joined = left.join(right, condition, "left").drop("_bin")
    return joined.withColumn(MATCHED, F.coalesce(F.col(MATCHED), F.lit(False)))
