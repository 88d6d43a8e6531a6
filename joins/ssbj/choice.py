"""``mode: auto`` for equi stages: SSBJ, or the plain join of the batch to the whole master.

SSBJ (seeds/ssbj_semi_stream_balanced_join.txt, Sec. 3) exists for one situation: a master
too large to scan whole each batch, read in 1/k slices (the MESHJOIN scan), with a hot
cache that answers skewed join values at once. Its price is per step:
the pending state H_S and the cache H_R are written and read back, and a tuple may wait up
to one R-cycle (k steps) for its answer. The plain join pays one scan of the master per
batch and answers every tuple at once.

Invariant: the choice is SSBJ only when all three hold

- the stage's freshness bound lets one R-cycle span two runs or more
  (``pipeline.freshness``): within one run SSBJ reads all k partitions, the whole master,
  as the plain join does, and pays its state's I/O besides (BENCHMARKS.md, section 1,
  measures both at the bound of one interval);
- the master's live files exceed ``ssbj_above_bytes`` (where a scan of the whole master
  costs less than an SSBJ step's bookkeeping), and
- the master has at least ``ssbj_master_batches`` times the batch's rows (against a
  master much smaller than the batch, there is no scan to save);

otherwise the plain join. The config's defaults (0 bytes, 0.25 batches) follow the measured
points (BENCHMARKS.md, sections 1 and 3, ``benchmarks.ssbj_scale`` and
``benchmarks.interval_cost``). Since an SSBJ step runs in the driver on Arrow columns (no
Python loop per tuple, no Spark job), it cost less than the plain join's step at every
shape measured, from TPC-H SF0.1 partsupp (80k rows, 0.4 batches of 200k) to SF30 (24M
rows), and since the audit validates batches of up to a million rows in memory
(``quality.batch_engine``), the whole interval did too: 200k tuples an interval against
SF1 partsupp (4 batches) cost 0.83x the plain PySpark job with SSBJ. The rule was 5
batches while that interval's audit validated SSBJ's 300k-800k-row outputs on Spark (1.82x
the plain job). Below 0.25 batches (no shape measured: the smallest, 0.4, still gave SSBJ
the cheaper step) the master is joined whole.
The sizes come from the Delta log (file sizes and ``numRecords`` statistics), so deciding
runs no Spark job. A master with no record counts in its log is weighed by bytes alone.

Where the sizes give SSBJ, the measured costs decide (:func:`measured_choice`): the
seconds per tuple of the stage's recent steps in each mode, SSBJ's over one R-cycle at
least (every partition read once) and without the one-off creation of its scan copy
(``pipeline.mode_costs``). A stage that never ran the plain join runs it once
first, to measure it; then SSBJ, as long as it costs no more per tuple, or 10% more when
it is the mode that ran last (a margin that keeps two close modes from taking turns).
Measurements only take SSBJ away: a master the sizes call small is always joined whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EquiMode = Literal["baseline", "ssbj"]


@dataclass(frozen=True)
class EquiSizes:
    """What the Delta logs say of one step's inputs."""

    master_bytes: int
    master_rows: int | None
    """None when a file of the master has no ``numRecords`` statistic."""
    batch_rows: int


@dataclass(frozen=True)
class EquiChoice:
    mode: EquiMode
    reason: str


def choose_equi_mode(
    sizes: EquiSizes, ssbj_above_bytes: int, ssbj_master_batches: float, cycle_runs: int
) -> EquiChoice:
    """The join of one equi step under ``mode: auto`` (module docstring); ``cycle_runs`` is
    how many scheduled runs the stage's freshness bound lets one R-cycle span
    (``min(B, k)``)."""
    if cycle_runs < 2:
        return EquiChoice(
            "baseline",
            "the freshness bound makes every R-cycle end within one run: SSBJ would read "
            "the whole master each run, as the plain join does, and add its state's reads "
            "and writes (freshness.complete_within of 2 or more intervals lets SSBJ read a "
            "slice of the master a run)",
        )
    if sizes.master_bytes <= ssbj_above_bytes:
        return EquiChoice(
            "baseline",
            f"the master's {sizes.master_bytes:,} B are within ssbj_above_bytes "
            f"({ssbj_above_bytes:,} B): one scan per batch costs less than SSBJ's state",
        )
    if sizes.master_rows is not None and sizes.master_rows < ssbj_master_batches * max(
        sizes.batch_rows, 1
    ):
        return EquiChoice(
            "baseline",
            f"the master's {sizes.master_rows:,} rows are under ssbj_master_batches "
            f"({ssbj_master_batches:g}) x the batch's {sizes.batch_rows:,}: there is little "
            "scan to save",
        )
    if sizes.master_rows is None:
        against_batch = "its log has no record counts, so its bytes alone decide"
        rows = ""
    else:
        against_batch = (
            f"at least ssbj_master_batches ({ssbj_master_batches:g}) x the batch "
            f"({sizes.batch_rows:,} rows)"
        )
        rows = f"{sizes.master_rows:,} rows, "
    return EquiChoice(
        "ssbj",
        f"the master ({rows}{sizes.master_bytes:,} B) is over ssbj_above_bytes "
        f"({ssbj_above_bytes:,} B) and {against_batch}",
    )


MEASURED_MARGIN = 0.1
"""How much dearer per tuple the mode that ran last may be before the other replaces it."""


@dataclass(frozen=True)
class ModeCost:
    """What a stage's recent steps in one mode cost: their seconds over the tuples they
    took in (an SSBJ tuple is counted at its first step; the later steps that scan for it
    add their seconds)."""

    steps: int
    tuples: float
    seconds: float

    def per_tuple(self) -> float | None:
        return self.seconds / self.tuples if self.tuples > 0 else None


def measured_choice(
    sized: EquiChoice,
    ssbj: ModeCost | None,
    plain: ModeCost | None,
    cycle_steps: int,
    last: EquiMode | None,
    holds_tuples: bool,
) -> EquiChoice:
    """The choice once the stage's measured costs are weighed (module docstring).

    Invariant: the result is SSBJ only when ``sized`` (the sizes' choice) is SSBJ, and
    then the plain join only when it was never measured and SSBJ holds no tuple (the
    probe), or both are measured (SSBJ over ``cycle_steps`` steps at least) and the
    plain join is cheaper per tuple by more than the margin the mode ``last`` run has.
    """
    if sized.mode == "baseline":
        return sized
    plain_cost = plain.per_tuple() if plain is not None else None
    if plain is None or plain_cost is None:
        if holds_tuples:
            return sized  # a probe would drain H_S first: measure the plain join later
        return EquiChoice(
            "baseline",
            f"{sized.reason}; the plain join was not measured on this stage yet, so this "
            "step runs it once to weigh the two by their cost",
        )
    ssbj_cost = ssbj.per_tuple() if ssbj is not None and ssbj.steps >= cycle_steps else None
    if ssbj is None or ssbj_cost is None:
        return EquiChoice(
            "ssbj",
            f"{sized.reason}; SSBJ is measured over its first R-cycle ({cycle_steps} steps) "
            f"before it is weighed against the plain join ({plain_cost * 1e6:.1f} us a tuple)",
        )
    # The mode that ran last keeps its place within the margin.
    limit = plain_cost
    if last == "ssbj":
        limit = plain_cost * (1 + MEASURED_MARGIN)
    elif last == "baseline":
        limit = plain_cost / (1 + MEASURED_MARGIN)
    measured = (
        f"measured: SSBJ {ssbj_cost * 1e6:.1f} us a tuple over {ssbj.steps} steps, "
        f"the plain join {plain_cost * 1e6:.1f} us over {plain.steps}"
    )
    if ssbj_cost <= limit:
        return EquiChoice("ssbj", f"{sized.reason}; {measured}")
    return EquiChoice("baseline", f"{measured}: the plain join costs less per tuple")
