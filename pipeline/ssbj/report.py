"""What one SSBJ step reports: its counts, sizes and timings (:class:`SsbjStepReport`), and
the run metrics they are recorded as (:meth:`SsbjStepReport.as_metrics`; the names are
those of the metrics table, read by ``enrich status``, the run report and the audit)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from joins.ssbj.algorithm import StepCounts


@dataclass(kw_only=True)
class SsbjStepReport(StepCounts):
    """One SSBJ step's counts (Algorithm 1's, summed over the buckets), sizes and timings."""

    stage: str
    step: int
    pending_bytes: int = 0
    cache_bytes: int = 0
    master_bytes_read: int = 0
    master_rows_read: int = 0  # b of Eq. 1-2: the rows of the master partition scanned
    master_version: int = 0
    output_version: int | None = None
    seconds: float = 0.0
    # Of ``seconds``, what creating the scan copy took (a setup paid once; 0.0 at most steps).
    scan_created_seconds: float = 0.0
    state: str = ""
    # Eq. 1 at the end of the step, s_B's rows with H_R's: (b + h_R + |s_B|)·v_R + |H_S|·v_S
    state_bytes: float = 0.0
    memory_bytes: int | None = None  # the budget M, when one is set
    backlog_rows: int = 0  # input rows left waiting for a later step by the budget
    # FastJoin's Eq. 2 over the key buckets' loads this step, before and after the moves
    # the monitor planned for the next step (equal when nothing moved)
    load_imbalance: float = 1.0
    load_imbalance_after: float = 1.0
    moved_keys: int = 0
    moved_tuples: int = 0  # migration volume: state rows of the moved keys
    routed_keys: int = 0  # keys away from their home bucket in the next step's routing
    split_keys: int = 0  # hot keys spread over several buckets in the next step's routing
    tracked_keys: int = 0  # key_counts: sketch: the values the step counted (0 for exact)
    sketch_bytes: int = 0  # key_counts: sketch: the merged sketch's size
    # Tuples that met no master row and wait for a newer version (``joins.ssbj.late``);
    # ``tuples_in`` counts the step's new input only, not the ``returned`` ones.
    late_waits: bool = False  # the stage keeps such tuples (``operator.late_master``)
    late_entered: int = 0  # new input that met no row and waits
    late_answered: int = 0  # tuples that had waited, answered this step
    late_expired: int = 0  # tuples that had waited, whose wait ended unanswered
    late_rows: int = 0  # late rows in the state after the step
    late_waiting: int = 0  # tuples waiting after the step: late rows and returned ones in H_S
    late_oldest_us: int | None = None  # when the longest-waiting of them first met no row
    late_min_version: int | None = None  # the oldest version a late row met no row at
    # What the step wrote to the state table (``joins.ssbj.step``): its rows and, when
    # it replaced segments, how many; None when written from Spark tasks (not counted).
    state_rows_written: int | None = None
    state_segments_written: int | None = None

    def as_metrics(self) -> dict[str, float]:
        values: dict[str, float] = {
            "tuples_in": self.tuples_in,
            "cache_hits": self.cache_hits,
            "entered_pending": self.entered_pending,
            "expired": self.expired,
            "output_rows": self.output_rows,
            "pending_rows": self.pending_rows,
            "pending_bytes": self.pending_bytes,
            "cache_rows": self.cache_rows,
            "cache_bytes": self.cache_bytes,
            "master_bytes_read": self.master_bytes_read,
            "master_rows_read": self.master_rows_read,
            "master_version": self.master_version,
            "step_seconds": self.seconds,
            "state_bytes": self.state_bytes,
            "backlog_rows": self.backlog_rows,
            "load_imbalance": _finite(self.load_imbalance),
            "load_imbalance_after": _finite(self.load_imbalance_after),
            "moved_keys": self.moved_keys,
            "moved_tuples": self.moved_tuples,
            "routed_keys": self.routed_keys,
            "split_keys": self.split_keys,
            "counter_rows": self.counter_rows,
            "switch_rows": self.switch_rows,
            "tracked_keys": self.tracked_keys,
            "sketch_bytes": self.sketch_bytes,
            # Conservation view: every tuple in is served by the cache or waits.
            "tuples_matched": self.new_matched,
            "tuples_unmatched": self.new_unmatched,
            "tuples_pending": self.new_pending,
        }
        if self.late_waits or self.late_waiting or self.late_expired:
            values.update(
                late_waiting=self.late_waiting,
                late_answered=self.late_answered,
                late_expired=self.late_expired,
                late_entered=self.late_entered,
            )
        if self.output_version is not None:
            values["output_version"] = self.output_version
        if self.state_rows_written is not None:
            values["state_rows_written"] = self.state_rows_written
        if self.state_segments_written is not None:
            values["state_segments_written"] = self.state_segments_written
        if self.memory_bytes is not None:
            values["memory_bytes"] = self.memory_bytes
        if self.scan_created_seconds:
            values["scan_created_seconds"] = self.scan_created_seconds
        return values

    @property
    def new_matched(self) -> int:
        """New input tuples answered from H_R at entry (returned ones not counted)."""
        hits = self.cache_hits - self.cache_hits_unmatched
        return hits - (self.returned_hits - self.returned_hits_unmatched)

    @property
    def new_pending(self) -> int:
        """New input tuples that entered H_S, and (keeping late tuples) those H_R answered
        with no row, which wait as late rows: from the counters, not by difference, so
        that the conservation check can fail."""
        entered = self.entered_pending - (self.returned - self.returned_hits)
        fresh = self.cache_hits_unmatched - self.returned_hits_unmatched
        return entered + (fresh if self.late_waits else 0)

    @property
    def new_unmatched(self) -> int:
        """New input tuples H_R answered with no row, emitted or dropped at once: unless
        they wait for a late master row (then they are pending)."""
        fresh = self.cache_hits_unmatched - self.returned_hits_unmatched
        return 0 if self.late_waits else fresh


def _finite(value: float) -> float:
    """A metric value the metrics table can hold: an idle bucket beside a busy one makes
    LI infinite (Eq. 2), recorded as -1."""
    return value if math.isfinite(value) else -1.0
