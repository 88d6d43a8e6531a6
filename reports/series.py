"""Per-run series for the run report, from the state store's metrics and run ledger.

Pure functions over plain records: the metrics every step and audit records
(``run_metrics``) are grouped by run and reduced to one point per run and series:

- cache hit rate per SSBJ stage: cache hits over tuples in, over the run's steps;
- pending-state size per SSBJ stage: H_S rows and bytes after the run's last step;
- master bytes read, tuples in, rows out and step seconds per stage, summed over the
  run's steps;
- seconds per task and phase (session start, write, commit, validate, other);
- rows in (loaded by ingestion), out (written by stages), quarantined (by ingestion and
  by the audit);
- validation: batches that passed and failed their suites.

A run belongs to a report range when its data interval starts in the range; runs started
without an interval (ad-hoc CLI runs) are placed by when their metrics were recorded.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from common.phase_clock import SECONDS_PREFIX, TASK_PREFIX, TOTAL


class MetricRecord(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def stage(self) -> str: ...

    @property
    def step(self) -> int: ...

    @property
    def name(self) -> str: ...

    @property
    def value(self) -> float: ...

    @property
    def recorded_at(self) -> datetime: ...


class LedgerRecord(Protocol):
    @property
    def run_id(self) -> str: ...

    @property
    def interval_start(self) -> datetime | None: ...


@dataclass
class RunPoint:
    run_id: str
    at: datetime
    cache_hit_rate: dict[str, float] = field(default_factory=dict)
    pending_rows: dict[str, float] = field(default_factory=dict)
    pending_bytes: dict[str, float] = field(default_factory=dict)
    master_bytes_read: dict[str, float] = field(default_factory=dict)
    stage_in: dict[str, float] = field(default_factory=dict)
    """Tuples that entered each stage in the run (its own input, not the stream's)."""
    stage_out: dict[str, float] = field(default_factory=dict)
    """Rows each stage wrote in the run."""
    step_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds each stage's steps took in the run, summed."""
    rows_in: float = 0.0
    rows_out: float = 0.0
    rows_quarantined: float = 0.0
    # Records re-sent under ids already loaded, dropped at ingest (not quarantined rows).
    rows_resent: float = 0.0
    batches_passed: int = 0
    batches_failed: int = 0
    failed_tables: list[str] = field(default_factory=list)
    task_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    """``{task: {phase: seconds}}`` for each task of the run (``total`` included)."""


def aware_utc(moment: datetime) -> datetime:
    """``moment`` with UTC attached when it has no time zone (the store's naive times)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def run_points(
    metrics: Iterable[MetricRecord],
    ledger: Iterable[LedgerRecord],
    start: datetime | None = None,
    end: datetime | None = None,
) -> list[RunPoint]:
    """One point per run in [start, end), ordered by data interval (or recording time)."""
    interval_of: dict[str, datetime] = {}
    for run in ledger:
        base = run.run_id.split("/", 1)[0]
        if run.interval_start is not None:
            interval_of.setdefault(base, aware_utc(run.interval_start))
    grouped: dict[str, list[MetricRecord]] = defaultdict(list)
    for metric in metrics:
        grouped[metric.run_id].append(metric)
    points = []
    for run_id, records in grouped.items():
        if all(m.stage.startswith(TASK_PREFIX) for m in records):
            continue  # a maintenance or failed command: timings only, no data to plot
        at = interval_of.get(run_id) or min(aware_utc(m.recorded_at) for m in records)
        if (start and at < aware_utc(start)) or (end and at >= aware_utc(end)):
            continue
        points.append(_reduce(run_id, at, records))
    return sorted(points, key=lambda p: (p.at, p.run_id))


def _reduce(run_id: str, at: datetime, records: list[MetricRecord]) -> RunPoint:
    point = RunPoint(run_id, at)
    by_step: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for m in records:
        by_step[(m.stage, m.step)][m.name] = m.value
    hits: dict[str, float] = defaultdict(float)
    tuples: dict[str, float] = defaultdict(float)
    last_step: dict[str, int] = {}
    for (stage, step), values in sorted(by_step.items()):
        if stage.startswith(TASK_PREFIX):
            continue  # summed record by record below: a retried task records twice
        if stage.startswith("ingest."):
            point.rows_in += values.get("records_loaded", 0.0)
            point.rows_quarantined += values.get("records_quarantined", 0.0)
            point.rows_resent += values.get("records_resent", 0.0)
        elif stage.startswith("quality."):
            point.rows_quarantined += values.get("rows_quarantined", 0.0)
            if values.get("batch_failed", 0.0):
                point.batches_failed += 1
                point.failed_tables.append(stage.removeprefix("quality."))
            else:
                point.batches_passed += 1
        elif not stage.startswith("backfill."):
            point.rows_out += values.get("output_rows", 0.0)
            for target, name in (
                (point.stage_in, "tuples_in"),
                (point.stage_out, "output_rows"),
                (point.step_seconds, "step_seconds"),
            ):
                target[stage] = target.get(stage, 0.0) + values.get(name, 0.0)
            point.master_bytes_read[stage] = point.master_bytes_read.get(stage, 0.0) + values.get(
                "master_bytes_read", 0.0
            )
            if "cache_hits" in values:
                hits[stage] += values["cache_hits"]
                tuples[stage] += values.get("tuples_in", 0.0)
            if "pending_rows" in values and step >= last_step.get(stage, -1):
                last_step[stage] = step
                point.pending_rows[stage] = values["pending_rows"]
                point.pending_bytes[stage] = values.get("pending_bytes", 0.0)
    for stage, total in tuples.items():
        point.cache_hit_rate[stage] = hits[stage] / total if total else 0.0
    for m in records:
        if m.stage.startswith(TASK_PREFIX) and m.name.startswith(SECONDS_PREFIX):
            phases = point.task_seconds.setdefault(m.stage.removeprefix(TASK_PREFIX), {})
            phase = m.name.removeprefix(SECONDS_PREFIX)
            phases[phase] = phases.get(phase, 0.0) + m.value
    return point


def stage_series(points: list[RunPoint], attribute: str) -> Mapping[str, list[float | None]]:
    """``{stage: [value per run]}`` for a per-stage attribute; None where a run lacks it."""
    stages = sorted({s for p in points for s in getattr(p, attribute)})
    return {s: [getattr(p, attribute).get(s) for p in points] for s in stages}


def phase_series(points: list[RunPoint]) -> Mapping[str, list[float | None]]:
    """``{phase: [seconds per run, summed over the run's tasks]}``, ``total`` left out."""
    phases = sorted(
        {ph for p in points for t in p.task_seconds.values() for ph in t if ph != TOTAL}
    )
    return {
        ph: [sum(t.get(ph, 0.0) for t in p.task_seconds.values()) for p in points] for ph in phases
    }
