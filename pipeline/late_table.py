"""Where a stage keeps tuples waiting for late master rows, and the columns it adds to them.

No Spark here: ``enrich status`` reads the table with delta-rs (see
:mod:`pipeline.waiting_tuples` for what the table holds and how steps use it).
"""

from __future__ import annotations

from pipeline.layout import WarehouseLayout

LATE_SINCE = "_late_since"  # the time of the step that first found no master row
LATE_STEP = "_late_step"  # that step
LATE_COLUMNS = (LATE_SINCE, LATE_STEP)


def late_table(layout: WarehouseLayout, stage: str) -> str:
    """The late table of ``stage``: ``_operators/<stage>/late``."""
    return layout.operator_state(stage, "late")
