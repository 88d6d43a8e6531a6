"""Statistics for theta planning on Spark: one sampling job over both sides' keys.

Each side's ordering key (as a number, :func:`joins.adsp.numeric`) and, for a range
predicate, the master's interval width go through one ``mapInArrow`` pass that keeps a
bottom-k sample per partition (:class:`joins.key_sample.BottomK`); the driver merges them
and derives histograms and candidate ranges (:mod:`joins.key_sample`). Four passes
(quantiles and bucket counts per side) became one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from joins.adsp import key_spec, numeric
from joins.adsp_plan import Histogram, ThetaPlan, ValueRange, plan_theta
from joins.key_sample import (
    BottomK,
    KeySample,
    PartialSample,
    boundaries,
    bucket_ranges,
    histogram,
    merge,
)
from joins.theta_predicate import ThetaPredicate

DEFAULT_SAMPLE_SIZE = 10_000
DEFAULT_BUCKETS = 32
SAMPLE_SCHEMA = "side int, rows long, keyed long, widest double, tag double, key double"


@dataclass(frozen=True)
class MasterStatistics:
    """The master's histogram and, per bucket, the stream values that can match it."""

    histogram: Histogram
    ranges: tuple[ValueRange | None, ...]


def master_statistics_of(
    sample: KeySample, predicate: ThetaPredicate, row_bytes: float, buckets: int
) -> MasterStatistics:
    bounds = boundaries(sample, buckets)
    return MasterStatistics(
        histogram(sample, row_bytes, bounds), bucket_ranges(predicate, bounds, sample.widest)
    )


def stream_histogram_of(
    sample: KeySample,
    row_bytes: float,
    buckets: int,
    bounds: Sequence[float] | None = None,
) -> Histogram:
    return histogram(sample, row_bytes, boundaries(sample, buckets) if bounds is None else bounds)


def _sampler(sides: int, size: int, seed: int):  # type: ignore[no-untyped-def]
    """The per-partition function: one :class:`BottomK` per side, then its rows out."""

    def sample(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        parts = [BottomK(size, np.random.default_rng([seed, partition, s])) for s in range(sides)]
        for batch in batches:
            side = batch.column(0).to_numpy(zero_copy_only=False)
            keys = batch.column(1).to_numpy(zero_copy_only=False).astype(float)
            widths = batch.column(2).to_numpy(zero_copy_only=False).astype(float)
            for s, part in enumerate(parts):
                mine = side == s
                if mine.any():
                    part.add(keys[mine], widths[mine])
        for s, part in enumerate(parts):
            n = len(part.keys)
            yield pa.RecordBatch.from_pydict(
                {
                    "side": pa.array([s] * (n + 1), pa.int32()),
                    "rows": pa.array([part.rows] + [None] * n, pa.int64()),
                    "keyed": pa.array([part.keyed] + [None] * n, pa.int64()),
                    "widest": pa.array([part.widest] + [None] * n, pa.float64()),
                    "tag": pa.array([None, *part.tags.tolist()], pa.float64()),
                    "key": pa.array([None, *part.keys.tolist()], pa.float64()),
                }
            )

    return sample


def key_samples(
    sides: Sequence[tuple[DataFrame, Column, Column | None]],
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed: int = 0,
) -> list[KeySample]:
    """A uniform sample of each side's keys (with exact counts), in one Spark job.

    ``sides``: (frame, numeric key, numeric interval width or None) per side.
    """
    parts = [
        frame.select(
            F.lit(index).cast("int").alias("side"),
            key.cast("double").alias("key"),
            (width if width is not None else F.lit(None)).cast("double").alias("width"),
        )
        for index, (frame, key, width) in enumerate(sides)
    ]
    union = reduce(DataFrame.unionByName, parts)
    table = union.mapInArrow(_sampler(len(sides), sample_size, seed), SAMPLE_SCHEMA).toArrow()
    side = table.column("side").to_numpy()
    summary = table.column("rows").is_valid().to_numpy(zero_copy_only=False)
    samples = []
    for s in range(len(sides)):
        partials = []
        mine = side == s
        heads = np.flatnonzero(mine & summary)
        bodies = mine & ~summary
        for head in heads:
            partials.append(
                PartialSample(
                    int(table.column("rows")[head].as_py()),
                    int(table.column("keyed")[head].as_py()),
                    float(table.column("widest")[head].as_py()),
                    np.empty(0),
                    np.empty(0),
                )
            )
        tags = table.column("tag").to_numpy(zero_copy_only=False)[bodies]
        keys = table.column("key").to_numpy(zero_copy_only=False)[bodies]
        partials.append(PartialSample(0, 0, 0.0, tags.astype(float), keys.astype(float)))
        samples.append(merge(partials, sample_size))
    return samples


def stream_key(stream: DataFrame, predicate: ThetaPredicate) -> Column:
    keys = key_spec(predicate)
    return numeric(F.col(keys.stream_key), stream.schema[keys.stream_key].dataType)


def master_key(master: DataFrame, predicate: ThetaPredicate) -> tuple[Column, Column | None]:
    """The master's ordering key and, for a range predicate, its interval width."""
    keys = key_spec(predicate)
    key = numeric(F.col(keys.master_key), master.schema[keys.master_key].dataType)
    if keys.master_high is None:
        return key, None
    high = numeric(F.col(keys.master_high), master.schema[keys.master_high].dataType)
    return key, high - key


def stream_sample(
    stream: DataFrame, predicate: ThetaPredicate, sample_size: int = DEFAULT_SAMPLE_SIZE
) -> KeySample:
    """The stream's key sample alone (one job)."""
    (sample,) = key_samples([(stream, stream_key(stream, predicate), None)], sample_size)
    return sample


def master_sample(
    master: DataFrame, predicate: ThetaPredicate, sample_size: int = DEFAULT_SAMPLE_SIZE
) -> KeySample:
    """The master's key sample alone (one job), with the widest interval for ranges."""
    key, width = master_key(master, predicate)
    (sample,) = key_samples([(master, key, width)], sample_size)
    return sample


def theta_samples(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
) -> tuple[KeySample, KeySample]:
    """Both sides' key samples in one job: (stream, master)."""
    key, width = master_key(master, predicate)
    stream_sample, master_sample = key_samples(
        [(stream, stream_key(stream, predicate), None), (master, key, width)], sample_size
    )
    return stream_sample, master_sample


def plan_from_samples(
    stream: KeySample,
    master: KeySample,
    predicate: ThetaPredicate,
    task_memory: float,
    scheme: str,
    stream_row_bytes: float,
    master_row_bytes: float,
    buckets: int = DEFAULT_BUCKETS,
) -> ThetaPlan:
    stats = master_statistics_of(master, predicate, master_row_bytes, buckets)
    stream_hist = stream_histogram_of(stream, stream_row_bytes, buckets)
    return plan_theta(stats.histogram, stream_hist, stats.ranges, task_memory, scheme)


def theta_plan(
    stream: DataFrame,
    master: DataFrame,
    predicate: ThetaPredicate,
    task_memory: float,
    scheme: str,
    stream_row_bytes: float,
    master_row_bytes: float,
    buckets: int = DEFAULT_BUCKETS,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
) -> ThetaPlan:
    stream_sample, master_sample = theta_samples(stream, master, predicate, sample_size)
    return plan_from_samples(
        stream_sample,
        master_sample,
        predicate,
        task_memory,
        scheme,
        stream_row_bytes,
        master_row_bytes,
        buckets,
    )
