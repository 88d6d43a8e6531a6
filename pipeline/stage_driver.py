"""The one protocol every stage's operator is driven through, and what a step reports.

A :class:`StageDriver` runs a stage's work (a scheduled step, a drain, a backfill of an
interval) and gives an accounting view of the tuples it holds back (pending), which the
audit checks: every input tuple is emitted, published earlier, or pending. The views are
:class:`common.rows.Rows`, built in the form the audit validates in. The runner and the
audit know drivers only through this protocol; ``pipeline.drivers`` picks the driver of
each stage once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from common.rows import Rows
from pipeline.stage_config import EquiStage, ThetaStage


@dataclass(frozen=True)
class StepMetrics:
    """The metrics of one operator step, as the run ledger records them."""

    step: int
    values: dict[str, float]
    # Recorded already, with the step's completion (an SSBJ step): the runner skips it.
    recorded: bool = False


# The counts of a report that are metrics under their own names: the conservation view
# (every tuple in is matched, unmatched or pending) and the master's bytes read.
COUNTED = (
    "tuples_in",
    "output_rows",
    "tuples_matched",
    "tuples_unmatched",
    "tuples_pending",
    "master_bytes_read",
)


@dataclass
class StageReport:
    stage: str
    step: int = 0
    tuples_in: int = 0
    output_rows: int = 0
    tuples_matched: int = 0
    tuples_unmatched: int = 0
    tuples_pending: int = 0
    master_version: int | None = None
    master_bytes_read: int = 0
    seconds: float = 0.0
    committed: bool = False
    extra: dict[str, float] = field(default_factory=dict)
    # Each step the driver took, in order; the runner records them (a step that found
    # nothing to do has none).
    steps: list[StepMetrics] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        """The counts under their own names, the version and the seconds under the metrics
        table's, and the driver's ``extra``."""
        counted: dict[str, float] = {name: getattr(self, name) for name in COUNTED}
        master_version = float(self.master_version or 0)
        return {
            **counted,
            "master_version": master_version,
            "step_seconds": self.seconds,
            **self.extra,
        }


class PendingAccount(Protocol):
    """The tuples a driver holds back between steps, for the audit's accounting.

    A stateless driver holds none: ``pending_table`` is None and ``pending_ages`` None.
    """

    def consumed_version(self) -> int:
        """The input table's version up to which every row has entered the stage (joined
        or pending); the audit accounts for the input rows up to it."""
        ...

    def pending_table(self) -> str | None:
        """The table holding the pending tuples (the audit pins the versions it reads)."""
        ...

    def pending_version(self) -> int | None:
        """That table's version now, None when there is none yet."""
        ...

    def pending_at(self, version: int) -> Rows:
        """The tuples pending at ``version`` of that table, with the input's columns."""
        ...

    def pending_ages(self, id_column: str) -> Rows | None:
        """Pending tuples now: ``tuple_id``, ``age_steps``, ``max_age_steps``."""
        ...

    def input_accounting(self, tuples: Rows, waiting: Rows | None, id_column: str) -> Rows:
        """``audit_input`` rows (``tuple_id``, ``must_emit``) for the input ``tuples`` that
        entered the stage and the ``waiting`` ones pending at the last audit: whether this
        stage's join must emit rows for each (``pipeline.emission``)."""
        ...


class StageDriver(PendingAccount, Protocol):
    """Runs one stage: a scheduled step, a drain, a backfill."""

    @property
    def stage(self) -> EquiStage | ThetaStage: ...

    def step(self, run_id: str, steps: int | None = None, close: bool = True) -> StageReport:
        """The scheduled work of one run: join what arrived since the last step.

        ``steps`` overrides how many operator steps a stateful operator takes this run
        (SSBJ's scheduled steps); ``close`` ends the run with the steps that answer every
        tuple the stage's freshness bound makes due (the continuous mode's micro-batches
        step without it: the scheduled run closes). A stateless stage's one step always
        joins everything that arrived, and ignores both.
        """
        ...

    def drain(self, run_id: str) -> StageReport:
        """Join everything that arrived; nothing stays pending afterwards."""
        ...

    def work_due(self) -> bool:
        """Whether a step now, with nothing new landed, would advance what this driver
        holds: tuples waiting for their partition, a half-done step, input a memory
        budget left, late tuples whose master moved or whose wait is over. The
        continuous mode steps on a quiet tick only when some stage's is true."""
        ...

    def backfill(self, start: datetime, end: datetime, run_id: str) -> StageReport:
        """Re-join the input rows of [start, end) against the master as of ``end`` and
        replace that interval of the output in one commit; live state is not disturbed."""
        ...
