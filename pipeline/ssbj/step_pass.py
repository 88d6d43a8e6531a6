"""One SSBJ step's pass over its data (seeds/ssbj_semi_stream_balanced_join.txt,
Algorithm 1, one loop iteration), and its commits (at most two).

The step's rows (``pipeline.ssbj.placement``) are laid out as one wide table, split by the
join value's hash into key buckets as the step's routing says, and each bucket runs
Algorithm 1 (``joins.ssbj.step`` -> ``joins.ssbj.buckets``). The result holds the enriched
rows, the whole new operator state and each bucket's counts and load; the output and the
state are committed from it (``pipeline.ssbj.commit``).

Where the pass runs (the driver, a collect, Spark tasks) is decided once per step by
``pipeline.ssbj.placement``, which reads the rows for that place and commits the result
(``pipeline.ssbj.commit``); this module does not branch on it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from joins.ssbj.algorithm import Schedule, StepPlan, schedule
from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.cache.rcycle import StepPosition
from joins.ssbj.wide_table import WideTable
from pipeline.ssbj import hot_keys, placement, planning
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.state import UNMEASURED_SIZES, ControllerState, SavedPlan, StepOutcome
from pipeline.ssbj.wiring import SsbjWiring
from warehouse.delta import Snapshot

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassResult:
    """What the step's pass leaves for completing the step."""

    counts: Counter[str]  # the buckets' counts, summed (minima for LATE_MIN_METRICS)
    reads: Schedule  # which master versions the step read, and how H_R and s_B moved
    planned: float  # time.monotonic() when the step's reads were planned
    written: float  # time.monotonic() when both commits were done
    sizes: TupleSizes | None  # v_S and v_R, when this step measured them
    replica_rows: bool  # the state written may hold a value's counters more than once
    routing: dict[str, Any] | None  # the next step's key routing (None: none kept)
    key_sketch: dict[str, Any] | None  # the operator's key sketch (None: none kept)
    segments: Mapping[str, Sequence[int]] | None  # the state table's (None: not known)

    def outcome(
        self, w: SsbjWiring, state: ControllerState, plan: SavedPlan, report: SsbjStepReport
    ) -> StepOutcome:
        """What the step leaves for the controller state, once ``report`` holds its
        counts."""
        return StepOutcome(
            partitions=state.partitions,
            entered_pending=report.entered_pending,
            tuples_seen=report.tuples_in + report.returned,
            pending_rows=report.pending_rows,
            cache_rows=report.cache_rows,
            switch_rows=report.switch_rows,
            counter_rows=report.counter_rows,
            late_rows=report.late_rows,
            late_waiting=report.late_waiting,
            late_oldest_us=report.late_oldest_us,
            late_min_version=report.late_min_version,
            cache_version=plan.master_version if w.use_cache else None,
            switch_version=self.reads.next_switch_version(
                state.switch_version, plan.master_version
            ),
            replica_rows=self.replica_rows,
            routing=self.routing,
            key_sketch=self.key_sketch,
            segments=self.segments,
            sizes=self.sizes,
        )


def run_pass(
    w: SsbjWiring,
    state: ControllerState,
    plan: SavedPlan,
    position: StepPosition,
    master: Snapshot,
    report: SsbjStepReport,
) -> PassResult:
    """The step's reads, its pass and both commits; then the hot keys' routing and sketch
    for the next step."""
    step = plan.step
    version = plan.master_version
    # The new input's DataFrame is built only when used: a step that runs in the driver
    # reads the rows as Arrow, and needs only their schema (known after the first step).
    new_rows = cache(lambda: placement.new_rows(w, state, plan))
    known = state.tuple_sizes()
    measured = None if known is not None else placement.measure_sizes(w, new_rows, master)
    sizes = known or measured or UNMEASURED_SIZES
    wide = WideTable.of(w.spec, placement.new_rows_schema(w, plan, new_rows), master.schema)

    late = planning.late_rule(w, state, plan)
    reads = schedule(
        position,
        version,
        w.use_cache,
        # Late rows may return, new tuples of the step pinned to its version.
        takes_input=plan.input_to > plan.input_from
        or (late is not None and int(state.late_rows) > 0),
        chunk_versions=[int(v) for v in state.chunks.values()],
        cache_version=state.cache_version,
        switch_version=state.switch_version,
    )
    asking = placement.asking_tuples(w, state, plan)
    routing = hot_keys.step_routing(w, state.routing)
    scans = placement.partition_scans(w, plan, position, master, reads)
    where = placement.place(w, state, reads, wide, routing, asking, scans)
    step_pass = placement.open_pass(
        where,
        placement.StepContext(w, state, plan, wide, routing, report),
        scans,
        master,
        reads,
        new_rows,
        asking,
    )
    stream_key, master_key = wide.plan_positions()
    report.late_waits = late is not None and late.waits
    step_plan = StepPlan(
        step=step,
        position=position,
        master_version=version,
        stream_key=stream_key,
        master_key=master_key,
        sizes=sizes,
        use_cache=w.use_cache,
        # Keeping late tuples, Algorithm 1 emits every tuple that met no row, to settle.
        left_join=w.spec.how == "left" or late is not None,
        switch_factor=w.params.switch_factor,
        estimator=w.params.scount_estimator,
        switch_version=reads.collecting,
        partition_versions=reads.partition_versions,
        one_row_per_value=not state.replica_rows,
    )
    planned = time.monotonic()
    shape = hot_keys.sketch_shape(w)
    saved_sketch = hot_keys.saved_sketch(w, state.key_sketch, shape)
    tracked = hot_keys.tracked_keys(shape, saved_sketch)
    function = wide.bucket_function(
        step_plan,
        step_pass.deltas,
        routing,
        w.params.rebalance_keys,
        tracked,
        shape,
        late,
    )
    outcome = step_pass.run(function)
    written = time.monotonic()
    report.tracked_keys = len(tracked) if tracked is not None else 0
    summary = outcome.summary
    return PassResult(
        summary.counts,
        reads,
        planned,
        written,
        sizes=measured,
        # Without split keys every value's rows met in one bucket: its counters and mark
        # are one row each in the state just written.
        replica_rows=bool(routing.split),
        routing=hot_keys.rebalance_after_step(w, step, routing, summary.loads, report),
        key_sketch=hot_keys.merge_sketches(position, shape, saved_sketch, summary.sketches, report),
        segments=outcome.segments,
    )
