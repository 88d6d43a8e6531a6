"""SSBJ cost model (Eq. 1–6) and a planner that recommends k and steps per run.

Memory, Eq. 1:  M = (b + h_R·f)·v_R + w_S·(R_t/b)·(v_P + f·v_S)
Step cost, Eq. 2: c_loop = c_IO(b) + b(c_H + c_B) + w_N(c_S + c_H + c_O)
                                  + w_S(c_E + c_S + c_A + c_O)
Service rate, Eq. 3: μ = (w_N + w_S) / c_loop; the join keeps up iff λ ≤ μ (Eq. 4, 5), and
Eq. 6 restates the memory needed at μ = λ.

On Spark every per-tuple constant of Eq. 2 multiplies one of three volumes, so the model is
kept in that aggregated form, plus a fixed per-step cost the paper does not have (job
scheduling and Delta commits, which dominate small steps):

    c_loop = overhead + per_master_row·b + per_cache_tuple·w_N + per_disk_tuple·w_S

with per_master_row = c_IO(b)/b + c_H + c_B, per_cache_tuple = c_S + c_H + c_O and
per_disk_tuple = c_E + c_S + c_A + c_O. :func:`fit_step_costs` estimates the four numbers
from measured steps by least squares; :func:`plan` then chooses k.

Invariant of :func:`plan`: the recommended k is feasible (λ < μ at the chosen w) and no
feasible candidate uses less memory (Eq. 1); ties go to the smaller k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepCosts:
    """Seconds per step: fixed, per master row read, per cache-served and per disk tuple."""

    overhead: float
    per_master_row: float
    per_cache_tuple: float
    per_disk_tuple: float


@dataclass(frozen=True)
class MemoryParams:
    """Bytes per stream tuple (v_S), master row (v_R), queue pointer (v_P); hash fudge f."""

    stream_bytes: float
    master_bytes: float
    pointer_bytes: float = 8.0
    fudge: float = 1.0


@dataclass(frozen=True)
class StepMeasurement:
    partition_rows: float  # b
    cache_tuples: float  # w_N
    disk_tuples: float  # w_S
    seconds: float


@dataclass(frozen=True)
class Plan:
    partitions: int  # k
    tuples_per_step: float  # w = w_N + w_S
    steps_per_run: int
    step_seconds: float  # c_loop
    service_rate: float  # μ
    memory_bytes: float  # M


def memory_bytes(
    partition_rows: float,
    cached_rows: float,
    disk_tuples: float,
    master_rows: float,
    p: MemoryParams,
) -> float:
    """Eq. 1."""
    chunks = master_rows / partition_rows
    return (partition_rows + cached_rows * p.fudge) * p.master_bytes + disk_tuples * chunks * (
        p.pointer_bytes + p.fudge * p.stream_bytes
    )


def loop_seconds(
    partition_rows: float, cache_tuples: float, disk_tuples: float, costs: StepCosts
) -> float:
    """Eq. 2 in aggregated form (see module docstring)."""
    return (
        costs.overhead
        + costs.per_master_row * partition_rows
        + costs.per_cache_tuple * cache_tuples
        + costs.per_disk_tuple * disk_tuples
    )


def service_rate(cache_tuples: float, disk_tuples: float, seconds: float) -> float:
    """Eq. 3."""
    return (cache_tuples + disk_tuples) / seconds


def fit_step_costs(measurements: Sequence[StepMeasurement]) -> StepCosts:
    """Least-squares fit of the aggregated Eq. 2 to measured steps (costs clipped at 0)."""
    if len(measurements) < 4:
        raise ValueError(f"need at least 4 measured steps to fit 4 costs, got {len(measurements)}")
    design = np.array(
        [[1.0, m.partition_rows, m.cache_tuples, m.disk_tuples] for m in measurements]
    )
    seconds = np.array([m.seconds for m in measurements])
    solution, *_ = np.linalg.lstsq(design, seconds, rcond=None)
    overhead, per_master, per_cache, per_disk = (max(0.0, float(x)) for x in solution)
    return StepCosts(overhead, per_master, per_cache, per_disk)


def plan(
    master_rows: int,
    arrival_rate: float,
    cache_share: float,
    cached_rows: float,
    costs: StepCosts,
    memory: MemoryParams,
    run_seconds: float,
    memory_budget: float = math.inf,
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128),
) -> Plan:
    """Recommend k, w and steps per run for arrival rate λ within a memory budget.

    For each k, Eq. 5 gives the smallest w that keeps up: λ·c_loop(w) = w, i.e.
    ``w = λ·A / (1 − λ·B)`` with A the w-independent part of c_loop and B its slope in w.
    """
    if not 0.0 <= cache_share <= 1.0:
        raise ValueError(f"cache_share must be within [0, 1], got {cache_share}")
    if arrival_rate <= 0 or run_seconds <= 0:
        raise ValueError("arrival_rate and run_seconds must be positive")
    best: Plan | None = None
    slope = cache_share * costs.per_cache_tuple + (1 - cache_share) * costs.per_disk_tuple
    for k in sorted(set(candidates)):
        if k < 1 or k > master_rows:
            continue
        b = master_rows / k
        fixed = costs.overhead + costs.per_master_row * b
        if arrival_rate * slope >= 1.0:
            continue
        w = max(1.0, arrival_rate * fixed / (1.0 - arrival_rate * slope))
        w_n, w_s = cache_share * w, (1 - cache_share) * w
        seconds = loop_seconds(b, w_n, w_s, costs)
        needed = memory_bytes(b, cached_rows, w_s, master_rows, memory)
        if needed > memory_budget:
            continue
        per_run = max(1, math.ceil(run_seconds / seconds))
        candidate = Plan(k, w, per_run, seconds, service_rate(w_n, w_s, seconds), needed)
        if best is None or candidate.memory_bytes < best.memory_bytes:
            best = candidate
    if best is None:
        raise ValueError(
            f"no k in {list(candidates)} keeps up with λ={arrival_rate:g} tuples/s within "
            f"{memory_budget:g} bytes; raise the budget or add executors"
        )
    return best
