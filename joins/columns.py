"""Names and derivations of the lineage columns every enriched row carries."""

from __future__ import annotations

from pyspark.sql import DataFrame

from common.errors import JoinError
from common.rows import Frame, Rows, with_time_floor

INTERVAL_START = "_interval_start"
MATCHED = "_matched"
# A per-step identity of each input row, so that counts are per row even when the input
# (a previous stage's output) repeats a stream tuple id.
ROW_ID = "_row_id"


def version_column(master: str) -> str:
    """The column recording which master snapshot version enriched the row."""
    return f"_version_{master}"


def with_interval_start(rows: Rows, event_time: str, interval_seconds: int) -> Rows:
    """``rows`` with the start of the scheduling interval each row's event time falls in:
    the event time floored to a multiple of the interval since the epoch (below zero too),
    a null time giving a null start, as a UTC timestamp. Rows that have it keep theirs."""
    return Rows.apply(_with_interval_start, rows, event_time=event_time, step=interval_seconds)


def _with_interval_start(frame: Frame, event_time: str, step: int) -> Frame:
    if INTERVAL_START in frame.collect_schema():
        return frame
    return with_time_floor(frame, event_time, step, INTERVAL_START)


def require_disjoint(stream: DataFrame, master: DataFrame, stage: str) -> None:
    """Enriched rows take columns from both sides; a shared name would be ambiguous."""
    shared = sorted(set(stream.columns) & set(master.columns))
    if shared:
        raise JoinError(
            f"stage {stage}: master columns {shared} collide with input columns; project "
            "them away in the master's 'columns' or rename them"
        )
