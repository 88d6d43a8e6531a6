"""Hot keys across an SSBJ step's key buckets, carried from step to step in the controller
state: the key routing (FastJoin's monitor moves and splits hot keys between buckets,
``joins.skew.key_routing``) and, with ``operator.key_counts: sketch``, the key sketch
whose filter names the values a step counts (``joins.skew.asketch``).

Any routing is exact (every row of a join value meets in the buckets the routing gives
it), so a lost or reset routing costs balance, never correctness.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from joins.skew.asketch import ASketch, SketchShape
from joins.skew.key_routing import BucketLoad, KeyRouting, moves_of, rebalance
from joins.ssbj.buckets import sketch_of_json
from joins.ssbj.cache.rcycle import CycleState, StepPosition
from pipeline.ssbj.report import SsbjStepReport
from pipeline.ssbj.wiring import SsbjWiring

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- key routing


def buckets(w: SsbjWiring) -> int:
    """Key buckets of a step: one per shuffle partition (``spark.sql.shuffle.partitions``)."""
    configured = w.spark.conf.get("spark.sql.shuffle.partitions")
    return max(1, int(configured or 1))


def step_routing(w: SsbjWiring, saved: Mapping[str, Any] | None) -> KeyRouting:
    """The step's key routing: the ``saved`` one (``ControllerState.routing``), or every
    key at home when there is none or the bucket count changed (any routing is exact, see
    ``joins.skew.key_routing``)."""
    count = buckets(w)
    if saved is None or w.params.rebalance == "off":
        return KeyRouting(count)
    routing = KeyRouting.from_dict(dict(saved))
    if routing.buckets != count:
        logger.info(
            "ssbj %s: %d key buckets now (%d before): the %d moved keys go home",
            w.name,
            count,
            routing.buckets,
            len(routing.moved),
        )
        return KeyRouting(count)
    return routing


def rebalance_after_step(
    w: SsbjWiring,
    step: int,
    routing: KeyRouting,
    loads: list[BucketLoad],
    report: SsbjStepReport,
) -> dict[str, Any] | None:
    """FastJoin's monitor after the step: measure LI and, past the threshold, plan the
    moves that the next step's routing applies; the routing to save with the completed
    step (None: none is kept)."""
    method = w.params.rebalance
    if method == "off":  # LI is still measured: no threshold is ever exceeded
        report.load_imbalance = report.load_imbalance_after = rebalance(
            routing, loads, math.inf
        ).before
        return None
    planned = rebalance(
        routing,
        loads,
        w.params.rebalance_threshold,
        method,
        seed=step,
        split_factor=w.params.split_hot_keys,
        split_ways=w.params.split_ways,
    )
    report.load_imbalance = planned.before
    report.load_imbalance_after = planned.after
    report.moved_keys = planned.moved_keys
    report.moved_tuples = planned.moved_tuples
    routed = routing.with_moves(moves_of(planned.migrations), w.params.rebalance_table).with_splits(
        dict(planned.splits)
    )
    report.routed_keys = len(routed.moved)
    report.split_keys = len(routed.split)
    if planned.splits != routing.split:
        logger.info(
            "ssbj %s step %d: %d hot key(s) split over %s bucket(s) for the next step",
            w.name,
            report.step,
            len(planned.splits),
            "+".join(str(1 + len(r)) for _, r in planned.splits) or "no",
        )
    if planned.migrations:
        logger.info(
            "ssbj %s step %d: LI %.2f > %.2f, %s moves %d key(s) (%d stored rows) between "
            "buckets for the next step; LI by the load model %.2f after",
            w.name,
            report.step,
            planned.before,
            w.params.rebalance_threshold,
            method,
            planned.moved_keys,
            planned.moved_tuples,
            planned.after,
        )
    return routed.to_dict()


# ---------------------------------------------------------------------- key counts


def sketch_shape(w: SsbjWiring) -> SketchShape | None:
    """The ASketch size ``key_counts: sketch`` asks for; None for exact counts."""
    if w.params.key_counts != "sketch" or not w.use_cache:
        return None
    return SketchShape(w.params.sketch_keys, w.params.sketch_depth, w.params.sketch_width)


def saved_sketch(
    w: SsbjWiring, saved: Mapping[str, Any] | None, shape: SketchShape | None
) -> ASketch | None:
    """The key sketch ``saved`` with the last step (``ControllerState.key_sketch``), read
    once per step; None when there is none yet, or when the configured size changed (a
    new sketch starts this step)."""
    if shape is None or saved is None:
        return None
    sketch = ASketch.from_dict(dict(saved))
    if sketch.shape != shape:
        logger.info(
            "ssbj %s: the key sketch's size changed from %s to %s; a new one starts",
            w.name,
            sketch.shape,
            shape,
        )
        return None
    return sketch


def tracked_keys(shape: SketchShape | None, saved: ASketch | None) -> list[int] | None:
    """The key hashes this step counts: the saved sketch's filter (the most frequent
    values of the R-cycle so far, or of the last one at a cycle's first step); none
    before the first sketch. None counts every value (``key_counts: exact``)."""
    if shape is None:
        return None
    if saved is None:
        return []
    return sorted(key for key in saved.filter if isinstance(key, int))


def merge_sketches(
    position: StepPosition,
    shape: SketchShape | None,
    saved: ASketch | None,
    parts: list[bytes],
    report: SsbjStepReport,
) -> dict[str, Any] | None:
    """The buckets' key sketches (as their rows hold them) merged into the operator's
    (``saved``), to save with the step (None: no sketch is kept).

    The sketch counts the stream since the current incrementing cycle began, the
    cycle whose s_count the switching decision reads: it starts afresh at that cycle's
    first step (whose tracked values came from the cycle before)."""
    if shape is None:
        return None
    restart = position.starts_cycle and position.state is CycleState.INCREMENTING
    base = [] if saved is None or restart else [saved]
    sketches = base + [sketch_of_json(part) for part in parts]
    merged = ASketch.merge_all(sketches) if sketches else shape.empty()
    report.sketch_bytes = merged.size_bytes()
    return merged.to_dict()
