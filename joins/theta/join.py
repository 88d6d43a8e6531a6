"""One theta join under a named scheme, ``auto`` included: resolve it, then run it.

``resolve_scheme`` turns ``auto`` into a concrete scheme (:mod:`joins.theta.choice`): the
optimizer's size estimates decide small joins with no job at all; otherwise one counting
job decides when the master can be broadcast; otherwise one sampling job more, and the
samples it drew then plan A-DSP too, so choosing costs no second pass.
``scheme_join_flagged`` runs a concrete scheme with the flagged output of
:mod:`joins.baseline` (matches flagged, unmatched stream rows once with nulls).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from joins import baseline
from joins.theta.adsp.join import adsp_join_flagged
from joins.theta.choice import (
    SAMPLE_ABOVE_BYTES,
    ClusterFigures,
    SchemeChoice,
    choose_by_counts,
    choose_by_size,
    choose_scheme,
)
from joins.theta.key_sample import KeySample
from joins.theta.predicate import ThetaPredicate
from joins.theta.stats import (
    draw_samples,
    observed_samples,
    plan_from_samples,
    side_counts,
    theta_samples,
    theta_sides,
)
from warehouse.spark import PlanSize, broadcast_threshold, parallelism, plan_size

logger = logging.getLogger(__name__)

Samples = tuple[KeySample, KeySample]


class RowBytes(Protocol):
    """Bytes per row of each side. Measuring one can cost a job, so only the schemes that
    need them ask: the count rules (the master's) and the planned schemes (both)."""

    def stream(self) -> float: ...

    def master(self) -> float: ...


@dataclass(frozen=True)
class FixedRowBytes:
    """Row sizes known up front (benchmarks with fixed-width rows, tests)."""

    stream_bytes: float
    master_bytes: float

    def stream(self) -> float:
        return self.stream_bytes

    def master(self) -> float:
        return self.master_bytes


def _with_rows(size: PlanSize, rows: int | None) -> PlanSize:
    return size if size.rows is not None or rows is None else PlanSize(size.bytes, rows)


# Schemes planned from key samples: when ``auto`` picks one, it draws them once for both.
PLANNED_SCHEMES = ("adsp", "square", "dynamic")


def resolve_scheme(
    spark: SparkSession,
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    scheme: str,
    sample_size: int,
    row_bytes: RowBytes,
    sample_above_bytes: float = SAMPLE_ABOVE_BYTES,
    known_rows: tuple[int | None, int | None] = (None, None),
) -> tuple[SchemeChoice, Samples | None]:
    """The concrete scheme, and the (stream, master) key samples if choosing drew them.

    ``known_rows`` are the sides' row counts where the caller knows them without a job
    (the Delta log's statistics); they stand in for the optimizer's, which a file scan
    lacks, so the size rules can decide before any job."""
    if scheme != "auto":
        return SchemeChoice(scheme, "named in the config"), None
    cluster = ClusterFigures(
        parallelism(spark), broadcast_threshold(spark), sample_above_bytes=sample_above_bytes
    )
    sizes = (
        _with_rows(plan_size(stream), known_rows[0]),
        _with_rows(plan_size(master), known_rows[1]),
    )
    by_size = choose_by_size(predicate, *sizes, cluster)
    if by_size is not None:
        return by_size, None  # decided before any job
    sides = theta_sides(stream, master, predicate)
    figures = (row_bytes.master(), cluster)
    if sizes[0].rows is not None and sizes[1].rows is not None:
        # Both row counts known: one job draws and counts. choose_scheme applies the
        # count rules first, so a broadcast the exact counts allow is still chosen.
        known = observed_samples(sides, [sizes[0].rows, sizes[1].rows], sample_size)
        return choose_scheme(predicate, known[0], known[1], *figures), (known[0], known[1])
    counts = side_counts(sides)
    decided = choose_by_counts(predicate, counts[0], counts[1], *figures)
    if decided is not None and decided.scheme not in PLANNED_SCHEMES:
        return decided, None  # a broadcast join: nothing needs the keys
    stream_sample, master_sample = draw_samples(sides, counts, sample_size)
    choice = decided or choose_scheme(predicate, stream_sample, master_sample, *figures)
    return choice, (stream_sample, master_sample)


def scheme_join_flagged(
    spark: SparkSession,
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    scheme: str,
    *,
    master_name: str,
    master_version: int,
    row_id: str,
    task_memory: float,
    sample_size: int,
    row_bytes: RowBytes,
    samples: Samples | None = None,
    broadcast: bool = False,
) -> DataFrame:
    """``stream`` joined to ``master`` by ``scheme`` (spark, binning, adsp, square, dynamic);
    ``broadcast`` hints Spark's nested loop to broadcast the master (``auto`` chose it)."""
    if scheme == "spark":
        return baseline.theta_join_flagged(
            stream, master, predicate, master_name, master_version, broadcast=broadcast
        )
    if scheme == "binning":
        return baseline.binned_band_join_flagged(
            stream, master, predicate, master_name, master_version
        )
    stream_sample, master_sample = samples or theta_samples(stream, master, predicate, sample_size)
    plan = plan_from_samples(
        stream_sample,
        master_sample,
        predicate,
        task_memory,
        scheme,
        stream_row_bytes=row_bytes.stream(),
        master_row_bytes=row_bytes.master(),
    )
    logger.info("theta %s plan: %d area(s), %d task(s)", scheme, len(plan.areas), plan.tasks)
    return adsp_join_flagged(stream, master, predicate, plan, master_name, master_version, row_id)
