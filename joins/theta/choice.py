"""``scheme: auto``: pick the theta join that should finish first, from the key samples.

Three candidates, from cheapest per row to most robust:

``spark``    Spark's broadcast nested-loop join. Every stream row is compared with every
             master row, with no statistics, shuffle or Python worker. It wins when the
             master is broadcastable and the comparisons per core stay under a budget
             (``NESTED_LOOP_PAIRS_PER_CORE``). Measured (BENCHMARKS.md): 1M stream rows
             against the 240-row promotions master take 0.95 s this way, against 8.6 s
             for A-DSP.
``binning``  range binning, for band predicates only: one JVM equi-join on
             ``floor(key / w)`` with ``w = lower + upper``; each master row goes to at most
             two bins. It is 2-5x faster than A-DSP in wall time on every band case
             measured, as long as no bin overloads one task. The equi-join shuffles by bin,
             so one task takes a whole bin. The estimate of the busiest bin's input rows
             is ``S_b + R_b``, scaled from the samples. Binning's makespan is about
             ``max(S_b + R_b, (S + R') / P)`` for ``P`` tasks at once; A-DSP balances its
             tasks but does ``ADSP_WORK`` times binning's task work (routing and
             replication), about ``ADSP_WORK (S + R') / P``. So binning is kept while
             ``S_b + R_b <= ADSP_WORK (S + R') / P``. If the binned master is
             broadcastable, nothing is shuffled and no bin can overload a task.
``adsp``     everything else: non-band predicates against a large master, and band
             predicates with a hot bin. A-DSP's join matrix splits a hot bin over
             several tasks (Alg. 2/3), and the samples drawn here plan it
             (:func:`joins.theta.stats.plan_from_samples`), so choosing costs no extra
             pass.

Both broadcast rules need the row counts only (:func:`choose_by_counts`), so ``auto`` draws
keys only for a band against a master too large to broadcast, or for a scheme that is
planned from them.

Before any job, the optimizer's size estimates decide what they can
(:func:`choose_by_size`): the broadcast rules when the estimates hold the row counts, and
range binning for a band join whose inputs are under ``sample_above_bytes``. The counting
and sampling jobs cost about 0.2-0.5 s here (BENCHMARKS.md, session 13), about what binning
takes for the whole of such a join. A hot bin can at worst put all of binning's input in
one task: for 16 MiB, at the ~24 MB/s per core measured for binning at 1M x 1M, about
0.7 s, so sampling could save at most about what it costs. (Output pairs are not in the
estimate: a wide band's hot bin forms its pairs in one task.)

Invariant: the choice depends only on the predicate, the size estimates, the samples
(exact row counts plus uniform key samples) and the cluster figures passed in. The same
inputs always give the same choice, so a run can be replayed. Every scheme is exact, so the
choice affects time only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Protocol

from joins.theta.key_sample import KeySample, SideCounts
from joins.theta.predicate import ThetaPredicate

# Sampling costs about as much as binning a band join of inputs this size in the worst case
# (module docstring); ``operator.sample_above_bytes`` overrides it.
SAMPLE_ABOVE_BYTES = 16 * 1024 * 1024
# A-DSP's task time over binning's for the same band join at z = 2, from the stage sums of
# the skew simulation (BENCHMARKS.md, session 16): 33.8 / 23.9 s at 1M rows, 40.6 / 23.6 s
# at 2M. On 2 cores the hot bin then never justifies A-DSP (it wins there in no measured
# case); on 64 executors a bin holding 61% of the stream does (2.3-2.6x).
ADSP_WORK = 1.5
# ~2.4e8 pairs/s/core measured for Spark's nested loop (promotions, 1M x 240, 2 cores,
# 0.95 s); 5e8 per core keeps it under about 2 s, below A-DSP's fixed cost.
NESTED_LOOP_PAIRS_PER_CORE = 500_000_000


@dataclass(frozen=True)
class ClusterFigures:
    """What a choice weighs besides its inputs: the tasks that run at once, Spark's
    broadcast threshold, and the cost constants above (overridable by a stage's operator
    settings, a test or a benchmark)."""

    parallelism: int
    broadcast_bytes: float
    sample_above_bytes: float = SAMPLE_ABOVE_BYTES
    nested_loop_pairs_per_core: float = NESTED_LOOP_PAIRS_PER_CORE
    adsp_work: float = ADSP_WORK

    @property
    def cores(self) -> int:
        return max(1, self.parallelism)


@dataclass(frozen=True)
class SchemeChoice:
    """The scheme ``auto`` resolved to, and why (for the log and the run metrics)."""

    scheme: str
    reason: str


@dataclass(frozen=True)
class BinLoad:
    """Estimated input rows of range binning's busiest bin, and of all bins together."""

    busiest: float
    total: float


def bin_load(predicate: ThetaPredicate, stream: KeySample, master: KeySample) -> BinLoad:
    """Scale the sampled keys' bins to the sides' row counts (master rows replicated to
    every bin their band reaches, as :func:`joins.baseline.binned_band_join_flagged` does)."""
    lower, upper = predicate.band_bounds()
    width = max(lower + upper, 1e-9)
    loads: dict[int, float] = defaultdict(float)
    s_scale = stream.keyed / len(stream.keys) if len(stream.keys) else 0.0
    r_scale = master.keyed / len(master.keys) if len(master.keys) else 0.0
    for key in stream.keys:
        loads[math.floor(key / width)] += s_scale
    replicated = 0.0
    for key in master.keys:
        first, last = math.floor((key - upper) / width), math.floor((key + lower) / width)
        for b in range(first, last + 1):
            loads[b] += r_scale
            replicated += r_scale
    return BinLoad(max(loads.values(), default=0.0), stream.keyed + replicated)


class SideSize(Protocol):
    """The optimizer's estimate of one side (no job ran for it): bytes, and rows if known
    (``warehouse.spark.PlanSize`` on Spark)."""

    @property
    def bytes(self) -> float: ...

    @property
    def rows(self) -> int | None: ...


def broadcast_rules(
    predicate: ThetaPredicate,
    stream_rows: int | None,
    master_rows: int | None,
    master_bytes: float,
    cluster: ClusterFigures,
    size_note: str,
) -> SchemeChoice | None:
    """The two broadcast rules, from counted or estimated sizes (``size_note`` says which,
    in the reason); None when neither applies.

    - A band whose binned master (``2 * master_bytes``: at most two bins per row) is
      broadcast: binning, with no shuffle and so no hot bin.
    - Any other predicate whose master is broadcast and whose nested loop stays under
      ``nested_loop_pairs_per_core`` comparisons per core: Spark's nested loop. The
      comparisons need both row counts; without them this rule does not apply.
    """
    broadcast_bytes = cluster.broadcast_bytes
    if predicate.type == "band" and predicate.master_column:
        if 2 * master_bytes <= broadcast_bytes:
            return SchemeChoice(
                "binning",
                f"band predicate, binned master ({2 * master_bytes:.0f} B{size_note}) is "
                "broadcast: no shuffle, no hot bin",
            )
        return None
    if stream_rows is None or master_rows is None or master_bytes > broadcast_bytes:
        return None
    pairs_per_core = stream_rows * master_rows / cluster.cores
    if pairs_per_core > cluster.nested_loop_pairs_per_core:
        return None
    return SchemeChoice(
        "spark",
        f"{predicate.type} predicate, master {master_rows} rows ({master_bytes:.0f} B"
        f"{size_note}) is broadcast; {pairs_per_core:.3g} comparisons per core <= "
        f"{cluster.nested_loop_pairs_per_core:.3g}",
    )


def choose_by_size(
    predicate: ThetaPredicate,
    stream: SideSize,
    master: SideSize,
    cluster: ClusterFigures,
) -> SchemeChoice | None:
    """The scheme when the size estimates alone decide it, else None (count, then maybe
    sample: :func:`choose_by_counts`, :func:`choose_scheme`).

    The broadcast rules (:func:`broadcast_rules`) on the estimated bytes that Spark's own
    broadcast rule reads, and the rows where the estimates hold them; then a band join
    whose inputs (the master twice, as binning replicates it) are under
    ``sample_above_bytes`` bins: sampling could not save what it costs (module docstring).
    """
    broadcast = broadcast_rules(
        predicate, stream.rows, master.rows, master.bytes, cluster, size_note=" estimated"
    )
    if broadcast is not None or predicate.type != "band" or not predicate.master_column:
        return broadcast
    inputs = stream.bytes + 2 * master.bytes
    sample_above_bytes = cluster.sample_above_bytes
    if inputs < sample_above_bytes:
        return SchemeChoice(
            "binning",
            f"band predicate, inputs {inputs:.0f} B estimated < {sample_above_bytes:.0f} "
            "(operator.sample_above_bytes): sampling for a hot bin would cost about what "
            "it could save",
        )
    return None


def choose_by_counts(
    predicate: ThetaPredicate,
    stream: SideCounts,
    master: SideCounts,
    master_row_bytes: float,
    cluster: ClusterFigures,
) -> SchemeChoice | None:
    """The scheme when the row counts alone decide it, else None (a band predicate against a
    master too large to broadcast, where the keys decide: :func:`choose_scheme`).

    No rule here looks at the keys, so ``auto`` draws none for a broadcast join: against the
    240-row promotions master that saves the sampling job."""
    master_bytes = master.rows * master_row_bytes
    broadcast = broadcast_rules(
        predicate, stream.rows, master.rows, master_bytes, cluster, size_note=""
    )
    if broadcast is not None or (predicate.type == "band" and predicate.master_column):
        return broadcast
    pairs_per_core = stream.rows * master.rows / cluster.cores
    return SchemeChoice(
        "adsp",
        f"{predicate.type} predicate, master {master.rows} rows ({master_bytes:.0f} B): "
        f"{pairs_per_core:.3g} comparisons per core for a nested loop",
    )


def choose_scheme(
    predicate: ThetaPredicate,
    stream: KeySample,
    master: KeySample,
    master_row_bytes: float,
    cluster: ClusterFigures,
) -> SchemeChoice:
    """The scheme for one join, following the rules in the module docstring."""
    decided = choose_by_counts(predicate, stream.counts, master.counts, master_row_bytes, cluster)
    if decided is not None:
        return decided
    # A band predicate against a master too large to broadcast: the keys decide.
    cores, adsp_work = cluster.cores, cluster.adsp_work
    load = bin_load(predicate, stream, master)
    balanced = adsp_work * load.total / cores
    if load.busiest <= balanced:
        return SchemeChoice(
            "binning",
            f"band predicate, busiest bin ~{load.busiest:.0f} input rows <= {balanced:.0f} "
            f"(A-DSP's {adsp_work:g}x work over {cores} tasks at once)",
        )
    return SchemeChoice(
        "adsp",
        f"band predicate with a hot bin: ~{load.busiest:.0f} input rows > {balanced:.0f} "
        f"(A-DSP's {adsp_work:g}x work over {cores} tasks at once)",
    )
