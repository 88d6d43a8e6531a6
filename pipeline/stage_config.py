"""The config models of one enrichment stage: an equi stage with SSBJ's operator parameters
(``mode``, k, the memory budget M, the cache and skew settings, the late-master wait) and a
theta stage with A-DSP's. ``pipeline.config`` composes them into a pipeline; like it, this
module imports neither Spark nor GX.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from common.durations import parse_duration
from common.model import Identifier, Strict
from joins.theta.choice import SAMPLE_ABOVE_BYTES
from joins.theta.predicate import ThetaPredicate
from pipeline.freshness import Freshness, steps_for_bound


class LateMaster(Strict):
    """``operator.late_master``: how long a tuple without a master row waits for one."""

    wait: str = Field(
        description=(
            "a tuple whose key has no master row at its step waits this long (30s, 15m, 2h, "
            "1d), probed against the master of every later step; answered from the first "
            "version that has its key, or, at expiry, emitted unmatched (left join) or "
            "dropped (inner join)"
        )
    )

    @field_validator("wait")
    @classmethod
    def _positive(cls, value: str) -> str:
        if parse_duration(value).total_seconds() <= 0:
            raise ValueError(f"expected a wait longer than zero, got {value!r}")
        return value

    @property
    def wait_delta(self) -> timedelta:
        return parse_duration(self.wait)


class SsbjParams(Strict):
    """Parameters of the SSBJ / MESHJOIN operator (see joins.ssbj)."""

    mode: Literal["auto", "baseline", "meshjoin", "ssbj"] = Field(
        default="auto",
        description=(
            "auto: each step picks SSBJ or the plain join of the batch to the whole master "
            "from the Delta log's sizes (joins.ssbj.choice; no Spark job) and logs why; "
            "ssbj, meshjoin (SSBJ without its cache) or baseline force one"
        ),
    )
    ssbj_above_bytes: int = Field(
        default=0,
        ge=0,
        description=(
            "auto: a master of at most this many bytes (its live files) is joined whole to "
            "each batch; only a larger one, also ssbj_master_batches times the batch's rows, "
            "gets SSBJ. 0: an SSBJ step cost less than the plain join's at every master "
            "measured (BENCHMARKS.md, section 3); raise it where a scan of the master is cheap"
        ),
    )
    ssbj_master_batches: float = Field(
        default=0.25,
        gt=0,
        description=(
            "auto: SSBJ only where the master has at least this many times the rows of the "
            "step's batch. 0.25: an SSBJ step cost less than the plain join's at every "
            "master measured, down to 0.4 batches (BENCHMARKS.md, section 3)"
        ),
    )
    collect_rows: int = Field(
        default=10_000_000,
        ge=0,
        description=(
            "a step whose result (the state, its new tuples' rows) is expected under this "
            "many rows runs its buckets in the driver and writes the output and the state "
            "from there: on the embedded engine its rows are read in the driver too (no "
            "Spark job), else collected in one Spark job; a larger one, or any with 0, runs "
            "its buckets in Spark tasks and writes the result with Spark jobs. 10M: a "
            "200k-tuple step against 80k master rows took 1.7 s in the driver and 6.6 s in "
            "Spark tasks on 2 cores, on the embedded engine (BENCHMARKS.md, section 3); on "
            "the native engine the collect ships the master partition through the JVM "
            "driver too: lower it for a small driver"
        ),
    )
    partitions: int = Field(default=8, ge=1, description="k: master partitions per R-cycle")
    steps_per_run: int | None = Field(
        default=None,
        ge=1,
        description=(
            "SSBJ steps a scheduled run takes; unset: ceil(k / B), the fewest that answer "
            "every tuple within the stage's freshness bound of B intervals (a run may take "
            "more to close the tuples that are due). Set below that, the config is refused"
        ),
    )
    switch_factor: float = Field(default=1.0, gt=0, description="s_f of the cache inequality")
    eviction_cycles: int = Field(
        default=10,
        ge=1,
        description=(
            "E: the cache is evicted at the start of every E-th R-cycle, from hits counted "
            "over those E cycles (Algorithm 1 lines 8 and 45 use E = 10)"
        ),
    )
    memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description=(
            "M: the operator's memory budget in bytes (Eq. 1: disk buffer + H_R + s_B + H_S). Each "
            "step admits only the input versions whose tuples fit beside the cache and the "
            "pending chunks; the rest waits in the input table. Unset: a scheduled step takes "
            "all new input; the continuous mode (enrich stream) holds 1 GiB"
        ),
    )
    rebalance: Literal["off", "greedyfit", "safit"] = Field(
        default="greedyfit",
        description=(
            "how hot join values move between key buckets (Spark tasks) when the buckets' "
            "load imbalance LI exceeds rebalance_threshold: FastJoin's GreedyFit or SAFit, "
            "or off (every value stays in bucket hash mod B). Moves happen between steps and "
            "never change the result"
        ),
    )
    rebalance_threshold: float = Field(
        default=2.0, ge=1.0, description="Theta: migrate when LI = L_max / L_min exceeds it"
    )
    split_hot_keys: float | None = Field(
        default=2.0,
        ge=1.0,
        description=(
            "a join value whose tuples exceed this many times a mean bucket's is split: its "
            "new tuples spread over several buckets, each with a copy of the rows they need "
            "(its owner keeps its state). Null: hot values only move whole. Needs rebalance"
        ),
    )
    split_ways: int | None = Field(
        default=None,
        ge=2,
        description=(
            "most buckets one split value spreads over (each holds a copy of its rows). 2 is "
            "STA's two choices for hot keys; null: as many as its tuples need, up to all"
        ),
    )
    rebalance_keys: int = Field(
        default=16,
        ge=1,
        description="heaviest keys each bucket reports per step: the candidates to move",
    )
    rebalance_table: int = Field(
        default=4096,
        ge=1,
        description="most moved keys the routing table keeps (the oldest moves go home)",
    )
    scount_estimator: Literal["extrapolated", "paper"] = Field(
        default="extrapolated",
        description=(
            "paper: s_count(j) sums master rows seen while j was pending, 0 if never seen; "
            "extrapolated: scales the sum to all k partitions, and skips values whose rows "
            "are not known yet (never seen, or no row counted in fewer than k partitions)"
        ),
    )
    key_counts: Literal["exact", "sketch"] = Field(
        default="exact",
        description=(
            "exact: every pending join value gets counters (one state row each); sketch: "
            "an ASketch of the stream's join values, merged from every bucket each step, "
            "picks the sketch_keys most frequent values of the current R-cycle, and only "
            "those are counted and can enter the cache. For key domains too large to count "
            "every value; the result is exact either way"
        ),
    )
    sketch_keys: int = Field(
        default=1024, ge=1, description="phi: the sketch's filter, the values tracked at once"
    )
    sketch_width: int = Field(
        default=2048,
        ge=16,
        description="counters per row of the sketch's count-min layer (error ~ e/width)",
    )
    late_master: LateMaster | None = Field(
        default=None,
        description=(
            "wait for master rows that arrive after the tuples that need them (the "
            "late-arriving dimension): the plain join keeps them in a late table "
            "(pipeline/waiting_tuples.py), SSBJ and MESHJOIN in their state (joins/ssbj/late.py); "
            "auto picks the plain join for such a stage"
        ),
    )
    sketch_depth: int = Field(
        default=4,
        ge=1,
        le=16,
        description="rows of the count-min layer (the error bound fails with p ~ exp(-depth))",
    )

    @model_validator(mode="after")
    def _options_that_need_others(self) -> SsbjParams:
        if self.key_counts == "sketch" and self.mode not in ("ssbj", "auto"):
            raise ValueError(
                f"key_counts: sketch bounds the counters of SSBJ's cache; mode {self.mode!r} "
                "keeps no cache (use key_counts: exact, or mode: ssbj)"
            )
        if self.split_ways is not None and self.split_hot_keys is None:
            raise ValueError(
                f"split_ways: {self.split_ways} bounds how hot values are split, but "
                "split_hot_keys is null (nothing is split); set split_hot_keys or drop "
                "split_ways"
            )
        return self


class EquiStage(Strict):
    name: Identifier
    kind: Literal["equi"]
    input: Identifier
    master: Identifier
    join_on: dict[Identifier, Identifier] = Field(min_length=1)
    join: Literal["inner", "left"] = "inner"
    output: Identifier
    operator: SsbjParams = Field(default_factory=SsbjParams)
    freshness: Freshness = Field(default_factory=Freshness)

    def scheduled_steps(self, interval: timedelta) -> int:
        """SSBJ steps a scheduled run of ``interval`` takes: ``operator.steps_per_run``, or
        the fewest that keep the freshness bound (``pipeline.freshness``)."""
        if self.operator.steps_per_run is not None:
            return self.operator.steps_per_run
        return steps_for_bound(self.operator.partitions, self.freshness.bound(interval))


LAYOUT_SCHEMES = ("adsp", "square", "dynamic")


class ThetaParams(Strict):
    scheme: Literal["auto", "adsp", "square", "dynamic", "full", "binning", "spark"] = Field(
        default="auto",
        description="auto picks, per run, Spark's broadcast nested loop, range binning or "
        "A-DSP from both sides' key samples (joins/theta/choice.py); the others force one. "
        "full: one 2-DSP varietal matrix over the whole of R x S, every pair of rows meeting "
        "in a task without pruning by key ranges (for a predicate whose key order does not "
        "bound its matches)",
    )
    task_memory_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    sample_size: int = Field(
        default=10_000,
        ge=100,
        description="keys sampled per side for the histograms and the auto choice",
    )
    sample_above_bytes: int = Field(
        default=SAMPLE_ABOVE_BYTES,
        ge=0,
        description="auto bins a band join whose inputs the optimizer estimates under this "
        "many bytes, with no counting or sampling job (joins/theta/choice.py); 0 samples "
        "every band join against a master too large to broadcast",
    )
    persist_layout: bool = Field(
        default=True,
        description="keep the master's routed layout between runs (adsp, square, dynamic, "
        "and auto when it picks adsp); each run then routes only its new stream rows",
    )


class ThetaStage(Strict):
    name: Identifier
    kind: Literal["theta"]
    input: Identifier
    master: Identifier
    predicate: ThetaPredicate
    join: Literal["inner", "left"] = "inner"
    output: Identifier
    operator: ThetaParams = Field(default_factory=ThetaParams)
    freshness: Freshness = Field(default_factory=Freshness)


Stage = Annotated[EquiStage | ThetaStage, Field(discriminator="kind")]
