"""``enrich plan STAGE``: what the cost models recommend for a stage, from what is stored.

Nothing runs: the inputs are the step metrics the runner recorded in the state store, the
operator state, and the Delta logs of the master (read with delta-rs, no Spark session).

- An SSBJ / MESHJOIN stage: the aggregated step cost of Eq. 2 is fitted to its measured
  steps (``joins.ssbj.cache.cost_model.fit_step_costs``: seconds against the master rows scanned b,
  the cache-served tuples w_N and the tuples that entered H_S w_S), then
  ``joins.ssbj.cache.cost_model.plan`` recommends k, tuples per step and steps per run for the
  measured arrival rate within the stage's memory budget (Eq. 1, 3-5).
- A theta stage: the scheme the config names, the one ``auto`` chose on its last steps
  (and why, in the task log), and the persisted A-DSP layout if there is one (its scheme,
  tasks and the master version it was planned from).

Invariant: the same stored state gives the same plan (no clock, no sampling).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

from deltalake import DeltaTable

from common.errors import ConfigError
from joins.ssbj.cache.cost_model import (
    MemoryParams,
    Plan,
    StepCosts,
    StepMeasurement,
    fit_step_costs,
    plan,
)
from pipeline.adsp_layout_state import LayoutState
from pipeline.config import PipelineConfig
from pipeline.layout import WarehouseLayout
from pipeline.stage_config import EquiStage, ThetaStage
from warehouse.object_store import storage_options
from warehouse.state_store import StateStore

# The fit needs more steps than its 4 unknowns to mean anything.
MIN_STEPS = 6
# The most recent steps describe the stage as it runs now.
RECENT_STEPS = 200
THETA_SCHEME_PREFIX = "theta_scheme_"


@dataclass(frozen=True)
class SsbjPlan:
    """The cost model's view of an SSBJ stage: what was measured and what it recommends."""

    stage: str
    steps_measured: int
    configured_partitions: int
    configured_steps_per_run: int
    arrival_rate: float  # λ, tuples per second of schedule time
    cache_share: float  # w_N / w over the measured steps
    master_rows: int
    costs: StepCosts | None
    recommendation: Plan | None
    reason: str  # why there is no recommendation, or what it is based on


@dataclass(frozen=True)
class ThetaStagePlan:
    """The scheme of a theta stage: configured, last chosen, and the kept layout."""

    stage: str
    configured_scheme: str
    last_chosen: str | None
    steps_measured: int
    layout_scheme: str | None
    layout_tasks: int | None
    layout_master_version: int | None
    layout_migrations: int


def plan_stage(config: PipelineConfig, store: StateStore, name: str) -> SsbjPlan | ThetaStagePlan:
    """The plan of stage ``name``; :class:`ConfigError` for an unknown or baseline stage."""
    stage = config.stage(name)
    steps = _steps(store, stage.name)
    if isinstance(stage, ThetaStage):
        return _theta_plan(stage, store, steps)
    if stage.operator.mode == "baseline":
        raise ConfigError(
            f"stages.{name}: a baseline stage joins each batch to the whole master; it has "
            "no k or steps to plan (operator.mode: ssbj or meshjoin has)"
        )
    return _ssbj_plan(config, stage, steps)


def _steps(store: StateStore, stage: str) -> list[dict[str, float]]:
    """The recorded metrics of each step of ``stage``, oldest first (the latest record of a
    step recorded twice, as a rerun of the same run does)."""
    by_step: dict[tuple[str, int], dict[str, float]] = {}
    for metric in store.metrics():
        if metric.stage == stage:
            by_step.setdefault((metric.run_id, metric.step), {})[metric.name] = metric.value
    return list(by_step.values())[-RECENT_STEPS:]


def _ssbj_plan(config: PipelineConfig, stage: EquiStage, steps: list[dict[str, float]]) -> SsbjPlan:
    layout = WarehouseLayout.of(config)
    master_path = layout.master(config, stage.master)
    master_rows, master_bytes = _table_size(master_path)
    measured = [
        StepMeasurement(
            partition_rows=s["master_rows_read"],
            cache_tuples=s.get("cache_hits", 0.0),
            disk_tuples=s.get("entered_pending", 0.0),
            seconds=s["step_seconds"],
        )
        for s in steps
        if "master_rows_read" in s and "step_seconds" in s
    ]
    tuples = sum(s.get("tuples_in", 0.0) for s in steps)
    hits = sum(s.get("cache_hits", 0.0) for s in steps)
    share = hits / tuples if tuples else 0.0
    period = config.schedule.interval_delta.total_seconds()
    per_run = stage.scheduled_steps(config.schedule.interval_delta)
    # Tuples entering per scheduled run, over the run's length: the measured λ.
    rate = (tuples / len(steps)) * per_run / period if steps else 0.0

    measured_view = functools.partial(
        SsbjPlan,
        stage=stage.name,
        steps_measured=len(measured),
        configured_partitions=stage.operator.partitions,
        configured_steps_per_run=per_run,
        arrival_rate=rate,
        cache_share=share,
        master_rows=master_rows,
    )

    def without(reason: str, costs: StepCosts | None = None) -> SsbjPlan:
        return measured_view(costs=costs, recommendation=None, reason=reason)

    if len(measured) < MIN_STEPS:
        return without(
            f"{len(measured)} measured step(s) with the master rows scanned; the fit of Eq. 2 "
            f"needs at least {MIN_STEPS} (run the stage, then plan again)"
        )
    if master_rows <= 0:
        return without(f"master {master_path} has no rows in its log")
    if rate <= 0:
        return without("no tuples arrived in the measured steps: nothing to keep up with")
    costs = fit_step_costs(measured)
    pending_rows = [s.get("pending_rows", 0.0) for s in steps]
    pending_bytes = [s.get("pending_bytes", 0.0) for s in steps]
    row_bytes = master_bytes / master_rows
    stream_bytes = sum(pending_bytes) / sum(pending_rows) if sum(pending_rows) else row_bytes
    memory = MemoryParams(stream_bytes=stream_bytes, master_bytes=row_bytes)
    cached = statistics.fmean(s.get("cache_rows", 0.0) for s in steps[-10:])
    budget = float(stage.operator.memory_bytes) if stage.operator.memory_bytes else float("inf")
    try:
        recommended = plan(master_rows, rate, share, cached, costs, memory, period, budget)
    except ValueError as e:
        return without(str(e), costs)
    return measured_view(
        costs=costs,
        recommendation=recommended,
        reason=f"Eq. 2 fitted to {len(measured)} steps; λ = {rate:.3g} tuples/s over "
        f"{config.schedule.interval} runs; {share:.0%} of tuples served by the cache",
    )


def _theta_plan(
    stage: ThetaStage, store: StateStore, steps: list[dict[str, float]]
) -> ThetaStagePlan:
    chosen = None
    for s in reversed(steps):
        names = [k[len(THETA_SCHEME_PREFIX) :] for k in s if k.startswith(THETA_SCHEME_PREFIX)]
        if names:
            chosen = names[0]
            break
    saved = LayoutState.read(store.operator_state(stage.name))
    tasks = None
    if saved is not None:
        from joins.theta.adsp.plan import plan_from_dict

        tasks = plan_from_dict(dict(saved.plan)).tasks
    return ThetaStagePlan(
        stage.name,
        stage.operator.scheme,
        chosen,
        len(steps),
        saved.scheme if saved is not None else None,
        tasks,
        saved.master_version if saved is not None else None,
        len(saved.migrations) if saved is not None else 0,
    )


def _table_size(path: str) -> tuple[int, int]:
    """Rows and bytes of a Delta table's latest version, from its log (0, 0 if none)."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options(path)):
        return 0, 0
    actions = DeltaTable(path, storage_options=storage_options(path)).get_add_actions(flatten=True)
    columns = {name: actions.column(name).to_pylist() for name in ("num_records", "size_bytes")}
    return (
        int(sum(v or 0 for v in columns["num_records"])),
        int(sum(v or 0 for v in columns["size_bytes"])),
    )


def describe(result: SsbjPlan | ThetaStagePlan) -> list[str]:
    """The plan as lines for a terminal or a task log."""
    if isinstance(result, ThetaStagePlan):
        lines = [
            f"theta stage {result.stage}: scheme {result.configured_scheme} in the config",
            f"  last chosen: {result.last_chosen or 'no step recorded yet'} "
            f"({result.steps_measured} step(s) recorded)",
        ]
        if result.layout_scheme:
            lines.append(
                f"  kept A-DSP layout: {result.layout_scheme}, {result.layout_tasks} task(s), "
                f"planned from master v{result.layout_master_version}, "
                f"{result.layout_migrations} migration(s)"
            )
        else:
            lines.append("  no kept A-DSP layout (operator.persist_layout is off, or no run yet)")
        return lines
    lines = [
        f"SSBJ stage {result.stage}: k = {result.configured_partitions}, "
        f"{result.configured_steps_per_run} step(s) per run in the config",
        f"  measured: {result.steps_measured} step(s), λ = {result.arrival_rate:.3g} tuples/s, "
        f"cache share {result.cache_share:.0%}, master {result.master_rows:,} rows",
    ]
    if result.costs is not None:
        c = result.costs
        lines.append(
            f"  step cost (Eq. 2): {c.overhead:.3g} s + {c.per_master_row:.3g} s/master row + "
            f"{c.per_cache_tuple:.3g} s/cache tuple + {c.per_disk_tuple:.3g} s/H_S tuple"
        )
    r = result.recommendation
    if r is None:
        lines.append(f"  no recommendation: {result.reason}")
    else:
        lines += [
            f"  recommended: k = {r.partitions}, {r.steps_per_run} step(s) per run, "
            f"{r.tuples_per_step:,.0f} tuples per step of {r.step_seconds:.2f} s",
            f"  service rate μ = {r.service_rate:.3g} tuples/s, memory M = "
            f"{r.memory_bytes / 2**20:,.1f} MiB (Eq. 1)",
            f"  based on: {result.reason}",
        ]
    return lines
