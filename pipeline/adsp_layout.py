"""The stateful A-DSP stage driver: the master's routed layout persists between runs.

Operator state (``_operators/<stage>/layout`` plus a small record in the state store):
the master rows routed to their physical tasks (``_task`` partitions, with ``_bucket`` and
``_slot``), the plan that routed them, the master statistics, and which physical task
plays each task of the plan. Each run then routes only its new stream rows.

Per run, one of:

``build``    no layout yet, the master moved to a new version, the layout is not the
             version the state recorded (a crash mid-write), or the scheme or V changed in
             the config: plan from fresh statistics and route the whole master;
``reuse``    the stored plan still fits: the busiest task, with this run's stream rows,
             holds between 50% and 80% of V (Sec. 5.5). Plans are generated for 65% of V,
             the middle of that band, so a fresh plan starts inside it with room to
             grow or shrink before the next change (the paper leaves the target open);
``migrate``  it does not: plan again from the stored master statistics and this run's
             stream, carry R lines over by start-point alignment, map old to new tasks
             (Alg. 4), derive the migration plan (Alg. 5) and apply it in one commit that
             rewrites only the touched tasks' partitions. The moved volume is recorded.
             A re-plan that moves nothing (the same layout again) writes nothing.

Commits that only vacuumed (``enrich maintain``) move neither the master nor the layout:
they change no row, so they trigger no build. The state's master and layout versions are
pinned (holder ``adsp.<stage>``, :mod:`pipeline.pins`) whenever the state is saved.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from joins.baseline import MATCHED, version_column
from joins.theta.adsp.adapt import (
    HIGH_WATER,
    LOW_WATER,
    carry_lines,
    scheme_change_reason,
    task_loads,
    task_ranges,
)
from joins.theta.adsp.join import (
    TASK,
    RoutedSides,
    flag_matches,
    join_routed,
    key_spec,
    numeric,
    route,
)
from joins.theta.adsp.migrated_rows import migrated_rows
from joins.theta.adsp.migration import Ranges, TaskRanges, migration_plan, task_mapping
from joins.theta.adsp.plan import ThetaPlan, ValueRange, plan_from_dict, plan_theta, plan_to_dict
from joins.theta.key_sample import KeySample
from joins.theta.stats import (
    MasterStatistics,
    master_sample,
    master_statistics_of,
    stream_histogram_of,
    stream_sample,
)
from pipeline.adsp_layout_state import LayoutMigration, LayoutState
from pipeline.maintenance import only_maintenance_since
from pipeline.pins import PinHolder, union_pins
from pipeline.row_bytes import measured_row_bytes
from pipeline.stage_config import ThetaStage
from warehouse.delta import DeltaEngine, PartitionFilter, Snapshot
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)

SLOTS = 64
BUCKETS = 32


@dataclass
class LayoutReport:
    mode: str
    reason: str
    tasks: int
    layout_rows_written: int = 0
    migrated_bytes: float = 0.0

    def as_metrics(self) -> dict[str, float]:
        return {
            "theta_tasks": self.tasks,
            "layout_built": float(self.mode == "build"),
            "layout_migrated": float(self.mode == "migrate"),
            "layout_rows_written": self.layout_rows_written,
            "migrated_master_bytes": self.migrated_bytes,
        }


class AdspLayoutStage:
    """Joins a theta stage's new stream rows against its persisted master layout."""

    def __init__(
        self,
        stage: ThetaStage,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        layout_path: str,
        scheme: str | None = None,
    ) -> None:
        self.stage = stage
        # The scheme this layout is planned with: the config's, or what ``auto`` chose.
        self.scheme = scheme or stage.operator.scheme
        self.sample_size = stage.operator.sample_size
        self._samples: tuple[KeySample, KeySample] | None = None
        self._stream_drawn: KeySample | None = None
        self.spark = spark
        self.engine = engine
        self.store = store
        self.path = layout_path
        self.predicate = stage.predicate
        self.task_memory = float(stage.operator.task_memory_bytes)
        self.plan_memory = (HIGH_WATER + LOW_WATER) / 2 * self.task_memory

    def join_flagged(
        self,
        stream: DataFrame,
        master: Snapshot,
        master_rows: DataFrame,
        row_id: str,
        run_id: str,
        samples: tuple[KeySample, KeySample] | None = None,
    ) -> tuple[DataFrame, LayoutReport]:
        """``samples`` (stream, master), when the caller already drew them (``auto``)."""
        self._samples, self._stream_drawn = samples, None
        plan, instances, report = self._prepare(stream, master, master_rows, run_id)
        keys = key_spec(self.predicate)
        stream_key = numeric(F.col(keys.stream_key), stream.schema[keys.stream_key].dataType)
        routed_stream = route(stream, stream_key, plan.stream, plan, "stream", SLOTS, instances)
        version = version_column(self.stage.master)
        layout = (
            self.engine.read(self.path)
            .select(*master_rows.columns, TASK)
            .withColumn(MATCHED, F.lit(True))
            .withColumn(version, F.lit(master.version).cast("bigint"))
        )
        master_schema = layout.drop(TASK).schema
        sides = RoutedSides(routed_stream, layout, stream.schema, master_schema)
        matched = join_routed(sides, self.predicate)
        return flag_matches(stream, matched, master_schema, row_id), report

    # ------------------------------------------------------------------ decisions

    def _prepare(
        self, stream: DataFrame, master: Snapshot, master_rows: DataFrame, run_id: str
    ) -> tuple[ThetaPlan, list[int], LayoutReport]:
        state = self.store.operator_state(self.stage.name) or {}
        saved = LayoutState.read(state)
        stream_bytes = measured_row_bytes(stream) or 1.0
        why_build = self._why_build(saved, master)
        if why_build:
            return self._build(stream, master, master_rows, stream_bytes, state, why_build)
        assert saved is not None
        old = plan_from_dict(dict(saved.plan))
        current = dataclasses.replace(
            old,
            stream=stream_histogram_of(
                self._stream_sample(stream),
                stream_bytes,
                len(old.stream.bucket_bytes),
                old.stream.boundaries,
            ),
        )
        reason = scheme_change_reason(task_loads(current, SLOTS), self.task_memory)
        if reason is None:
            logger.info("theta %s: layout reused (%d tasks)", self.stage.name, old.tasks)
            return current, list(saved.instances), LayoutReport("reuse", "", old.tasks)
        return self._migrate(
            stream, stream_bytes, old, saved, state, reason, run_id, master.table_path
        )

    def _why_build(self, saved: LayoutState | None, master: Snapshot) -> str:
        if saved is None:
            return "no layout yet"
        if not only_maintenance_since(
            self.engine, master.table_path, saved.master_version, master.version
        ):
            return f"master moved from v{saved.master_version} to v{master.version}"
        if saved.scheme != self.scheme or saved.task_memory != self.task_memory:
            return f"scheme ({saved.scheme} -> {self.scheme}) or task memory changed"
        if not self.engine.exists(self.path):
            return "layout table missing"
        if not only_maintenance_since(
            self.engine, self.path, saved.layout_version, self.engine.snapshot(self.path).version
        ):
            return "layout table is not at the version the state recorded"
        return ""

    def _plan(self, stats: MasterStatistics, stream: DataFrame, stream_bytes: float) -> ThetaPlan:
        return plan_theta(
            stats.histogram,
            stream_histogram_of(self._stream_sample(stream), stream_bytes, BUCKETS),
            stats.ranges,
            self.plan_memory,
            self.scheme,
        )

    def _stream_sample(self, stream: DataFrame) -> KeySample:
        """This run's stream keys, drawn once (a re-plan after the reuse check needs them too)."""
        if self._samples is not None:
            return self._samples[0]
        if self._stream_drawn is None:
            self._stream_drawn = stream_sample(stream, self.predicate, self.sample_size)
        return self._stream_drawn

    def _master_sample(self, master_rows: DataFrame) -> KeySample:
        if self._samples is None:
            return master_sample(master_rows, self.predicate, self.sample_size)
        return self._samples[1]

    # ------------------------------------------------------------------ build

    def _build(
        self,
        stream: DataFrame,
        master: Snapshot,
        master_rows: DataFrame,
        stream_bytes: float,
        state: dict[str, Any],
        reason: str,
    ) -> tuple[ThetaPlan, list[int], LayoutReport]:
        stats = master_statistics_of(
            self._master_sample(master_rows),
            self.predicate,
            measured_row_bytes(master_rows) or 1.0,
            BUCKETS,
        )
        plan = self._plan(stats, stream, stream_bytes)
        instances = list(range(plan.tasks))
        keys = key_spec(self.predicate)
        master_key = numeric(F.col(keys.master_key), master_rows.schema[keys.master_key].dataType)
        routed = route(
            master_rows,
            master_key,
            plan.master,
            plan,
            "master",
            SLOTS,
            instances,
            keep_position=True,
        )
        self.engine.create_table(self.path, routed.schema, (TASK,))
        outcome = self.engine.overwrite(self.path, routed)
        report = LayoutReport("build", reason, plan.tasks, outcome.rows_added)
        self._save(
            state, plan, stats, instances, master.table_path, master.version, outcome.table_version
        )
        logger.info(
            "theta %s: layout built (%s): %d tasks, %d routed master rows",
            self.stage.name,
            reason,
            plan.tasks,
            outcome.rows_added,
        )
        return plan, instances, report

    # ------------------------------------------------------------------ migrate

    def _migrate(
        self,
        stream: DataFrame,
        stream_bytes: float,
        old: ThetaPlan,
        saved: LayoutState,
        state: dict[str, Any],
        reason: str,
        run_id: str,
        master_path: str,
    ) -> tuple[ThetaPlan, list[int], LayoutReport]:
        stats = _stats_from(saved)
        new = carry_lines(old, self._plan(stats, stream, stream_bytes), SLOTS)
        # The stream side is not kept between runs, so only master (R) ranges count.
        old_tasks = [TaskRanges(t.r, Ranges()) for t in task_ranges(old, SLOTS)]
        new_tasks = [TaskRanges(t.r, Ranges()) for t in task_ranges(new, SLOTS)]
        r_total = sum(stats.histogram.bucket_bytes)
        mapping = task_mapping(old_tasks, new_tasks, r_total, 0.0)
        plan = migration_plan(old_tasks, new_tasks, mapping)
        old_instances = list(saved.instances)
        if not plan.copies and not plan.deletes and len(mapping) == new.tasks == old.tasks:
            logger.info("theta %s: re-planned (%s); nothing to move", self.stage.name, reason)
            instances = [old_instances[mapping[k]] for k in range(new.tasks)]
            report = LayoutReport("reuse", reason, new.tasks)
            layout_version, migration = saved.layout_version, None
        else:
            fresh = iter(range(max(old_instances, default=-1) + 1, 1 << 30))
            instances = [
                old_instances[mapping[k]] if k in mapping else next(fresh) for k in range(new.tasks)
            ]
            layout = self.engine.read(self.path, version=saved.layout_version)
            rows, touched = migrated_rows(
                layout, plan, old_instances, instances, len(stats.histogram.bucket_bytes), SLOTS
            )
            outcome = self.engine.replace(self.path, rows, [PartitionFilter(TASK, "in", touched)])
            moved = float(plan.moved("R"))
            # What routing the whole master again would write, replicas included.
            rebuild = float(sum((t.r.measure for t in new_tasks), Fraction(0)))
            report = LayoutReport(
                "migrate",
                reason,
                new.tasks,
                outcome.rows_added,
                migrated_bytes=moved * r_total,
            )
            layout_version = outcome.table_version
            migration = LayoutMigration(
                run_id=run_id,
                reason=reason,
                tasks_before=old.tasks,
                tasks_after=new.tasks,
                tasks_touched=len(touched),
                moved_fraction_of_master=moved,
                rebuild_fraction_of_master=rebuild,
                moved_master_bytes=moved * r_total,
                rows_rewritten=outcome.rows_added,
                stored_keys=LayoutMigration.KEYS,
            )
            logger.info(
                "theta %s: scheme change (%s): %d -> %d tasks, %d touched, moved %.1f%% of "
                "the master (%.0f B), %d rows rewritten",
                self.stage.name,
                reason,
                old.tasks,
                new.tasks,
                len(touched),
                100 * moved,
                moved * r_total,
                outcome.rows_added,
            )
        self._save(
            state,
            new,
            stats,
            instances,
            master_path,
            saved.master_version,
            layout_version,
            migration,
        )
        return new, instances, report

    # ------------------------------------------------------------------ state

    def _save(
        self,
        state: dict[str, Any],
        plan: ThetaPlan,
        stats: MasterStatistics,
        instances: list[int],
        master_path: str,
        master_version: int,
        layout_version: int,
        migration: LayoutMigration | None = None,
    ) -> None:
        """Save the layout as ``state`` (the operator state read this run) with it."""
        previous = LayoutState.read(state)
        migrations = tuple(previous.migrations) if previous is not None else ()
        layout = LayoutState(
            plan=plan_to_dict(plan),
            ranges=[None if r is None else [r.low, r.high] for r in stats.ranges],
            instances=instances,
            master_version=master_version,
            layout_version=layout_version,
            scheme=self.scheme,
            task_memory=self.task_memory,
            migrations=(*migrations, migration) if migration else migrations,
            stored_keys=LayoutState.KEYS,
        )
        # The master version the layout was built from, and the layout version a migration
        # reads by time travel, pinned in the transaction that saves the state.
        pins = union_pins({master_path: [master_version], self.path: [layout_version]})
        self.store.save_operator_state(
            self.stage.name,
            layout.in_operator_state(state),
            pins=(PinHolder.ADSP.of(self.stage.name), pins),
        )


def _stats_from(saved: LayoutState) -> MasterStatistics:
    plan = plan_from_dict(dict(saved.plan))
    ranges = tuple(None if r is None else ValueRange(r[0], r[1]) for r in saved.ranges)
    return MasterStatistics(plan.master, ranges)
