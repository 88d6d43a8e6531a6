"""One SSBJ bucket step: the columnar pass against the reference model, side by side.

    python -m benchmarks.bucket_step [--tuples 20000] [--pending 60000] [--keys 200000]
                                     [--partitions 4] [--zipf 1.5] [--repeats 5]

Builds one bucket's table as a step sees it (new tuples and H_S drawn Zipf over the key
domain, the master partition ``step mod k`` with 4 rows per key) and runs
``joins.ssbj.buckets.bucket_step`` on it with the columnar pass
(``joins/ssbj/columnar.py``) and with the reference model (decode every tuple, run
Algorithm 1 in Python, encode), alternately, in one process, at every state of the R-cycle
machine. It checks that both give the same rows and prints the median seconds of each and
their ratio as a markdown table. No Spark: this measures the driver's (or a task's) work
per bucket, which was 75% of an SSBJ step at SF1 (BENCHMARKS.md, section 3).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import types as T

from benchmarks.revision import has_uncommitted_changes, short_commit
from joins.ssbj.algorithm import StepPlan
from joins.ssbj.bucket_decode import BucketDeltas, WideLayout
from joins.ssbj.buckets import BucketStep, bucket_step
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.rcycle import StepPosition
from joins.ssbj.roles import NEW, PARTITION, PENDING, ROLE, master_field, stream_field
from joins.ssbj.step import JoinSpec
from joins.ssbj.wide_table import WideTable
from warehouse.delta.schema import spark_to_arrow

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
LAYOUT = WideLayout(("id", "k"), ("mk", "supplier", "price"), ("k",), ("mk",))


@dataclass(frozen=True)
class BucketShape:
    tuples: int
    pending: int
    keys: int
    partitions: int
    zipf: float


@cache
def wide_schema() -> pa.Schema:
    """The wide table a step lays out for ``LAYOUT`` (``WideTable.schema``, in Arrow)."""
    spec = JoinSpec(LAYOUT.stream_keys, LAYOUT.master_keys, LAYOUT.master_columns, "m", "inner")
    stream = T.StructType([T.StructField(c, T.LongType()) for c in LAYOUT.stream_columns])
    master = T.StructType(
        [
            T.StructField("mk", T.LongType()),
            T.StructField("supplier", T.LongType()),
            T.StructField("price", T.DoubleType()),
        ]
    )
    return spark_to_arrow(WideTable.of(spec, stream, master).schema)


def _rows(role: str, columns: dict[str, np.ndarray]) -> pa.Table:
    schema = wide_schema()
    n = len(next(iter(columns.values())))
    arrays = []
    for f in schema:
        if f.name == ROLE:
            arrays.append(pa.array([role] * n, f.type))
        elif f.name in columns:
            arrays.append(pa.array(columns[f.name], f.type))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def bucket_table(shape: BucketShape, seed: int = 1) -> pa.Table:
    """New tuples, H_S spread over the k - 1 earlier entry steps, and one partition."""
    rng = np.random.default_rng(seed)
    k = shape.partitions

    def keys(n: int) -> np.ndarray:
        return (
            (rng.zipf(shape.zipf, n) - 1) % shape.keys
            if shape.zipf > 1
            else rng.integers(0, shape.keys, n)
        )

    new = _rows(
        NEW, {stream_field("id"): np.arange(shape.tuples), stream_field("k"): keys(shape.tuples)}
    )
    pending = _rows(
        PENDING,
        {
            stream_field("id"): np.arange(shape.tuples, shape.tuples + shape.pending),
            stream_field("k"): keys(shape.pending),
            "_entry_step": rng.integers(k, 2 * k - 1, shape.pending)
            if k > 1
            else np.zeros(shape.pending, np.int64),
            "_pinned_version": np.zeros(shape.pending, np.int64),
            "_matched": np.zeros(shape.pending, bool),
        },
    )
    part_keys = np.repeat(np.arange(0, shape.keys, k), 4)
    partition = _rows(
        PARTITION,
        {
            master_field("mk"): part_keys,
            master_field("supplier"): np.tile(np.arange(4), len(part_keys) // 4),
            master_field("price"): rng.random(len(part_keys)),
            "_version": np.zeros(len(part_keys), np.int64),
        },
    )
    return pa.concat_tables([new, pending, partition])


def _median_seconds(table: pa.Table, plan: StepPlan, columnar: bool, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        bucket_step(table, BucketStep(LAYOUT, plan, BucketDeltas()), columnar=columnar)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def run(shape: BucketShape, repeats: int) -> list[tuple[str, float, float]]:
    """(cycle state, columnar s, reference s) at each state of the R-cycle machine."""
    table = bucket_table(shape)
    results = []
    k = shape.partitions
    for step in (2 * k, 3 * k, 4 * k):  # incrementing, switching, phase-out (E = 10)
        position = StepPosition(step, k, 10)
        plan = StepPlan(
            step=2 * k - 1 + (step % k),
            position=position,
            master_version=0,
            stream_key=LAYOUT.stream_key_positions,
            master_key=LAYOUT.master_key_positions,
            sizes=TupleSizes(24.0, 40.0),
            use_cache=True,
            left_join=True,
            partition_versions=frozenset({0}),
        )
        fast = bucket_step(table, BucketStep(LAYOUT, plan, BucketDeltas()), columnar=True)
        slow = bucket_step(table, BucketStep(LAYOUT, plan, BucketDeltas()), columnar=False)
        if Counter(map(str, fast.to_pylist())) != Counter(map(str, slow.to_pylist())):
            raise AssertionError(f"the two passes differ at {position.state.value}")
        columnar = _median_seconds(table, plan, True, repeats)
        reference = _median_seconds(table, plan, False, repeats)
        results.append((position.state.value, columnar, reference))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tuples", type=int, default=20_000, help="new tuples in the bucket")
    parser.add_argument("--pending", type=int, default=60_000, help="tuples in H_S")
    parser.add_argument("--keys", type=int, default=200_000, help="the key domain")
    parser.add_argument("--partitions", type=int, default=4, help="k")
    parser.add_argument("--zipf", type=float, default=1.5, help="skew of the keys (<= 1: none)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    shape = BucketShape(args.tuples, args.pending, args.keys, args.partitions, args.zipf)
    rows = run(shape, args.repeats)
    commit = short_commit(REPO) + ("+dirty" if has_uncommitted_changes(REPO) else "")
    lines = [
        f"`python -m benchmarks.bucket_step` at `{commit}`: {shape}",
        "",
        "| cycle state | columnar s | reference s | reference / columnar |",
        "|---|---|---|---|",
        *(f"| {s} | {c:.3f} | {r:.3f} | {r / c:.1f}x |" for s, c, r in rows),
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
