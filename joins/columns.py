"""Names and derivations of the lineage columns every enriched row carries."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from common.errors import JoinError

INTERVAL_START = "_interval_start"
MATCHED = "_matched"
# A per-step identity of each input row, so that counts are per row even when the input
# (a previous stage's output) repeats a stream tuple id.
ROW_ID = "_row_id"


def version_column(master: str) -> str:
    """The column recording which master snapshot version enriched the row."""
    return f"_version_{master}"


def with_interval_start(frame: DataFrame, event_time: str, interval_seconds: int) -> DataFrame:
    """Add the start of the scheduling interval that each row's event time falls in."""
    if INTERVAL_START in frame.columns:
        return frame
    seconds = F.unix_seconds(F.col(event_time))
    start: Column = F.timestamp_seconds(F.floor(seconds / interval_seconds) * interval_seconds)
    return frame.withColumn(INTERVAL_START, start)


def epoch_micros(times: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Timestamps as microseconds since the epoch (UTC) for integer arithmetic in numpy,
    with a mask of the non-null ones (a null reads as 0 there)."""
    micros = pc.cast(times, pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return micros.fill_null(0).to_numpy(), pc.is_valid(micros).to_numpy(zero_copy_only=False)


def with_interval_start_arrow(table: pa.Table, event_time: str, interval_seconds: int) -> pa.Table:
    """:func:`with_interval_start` of rows in the driver's memory: the same floor of the
    event time's Unix seconds to a multiple of the interval (a null time gives a null
    start), as ``timestamp[us, UTC]``."""
    if INTERVAL_START in table.column_names:
        return table
    values, valid = epoch_micros(table.column(event_time))
    step = interval_seconds * 1_000_000
    starts = np.floor_divide(values, step) * step  # floors below zero too, as Spark's floor
    column = pa.array(starts, pa.int64(), mask=~valid).cast(pa.timestamp("us", tz="UTC"))
    return table.append_column(INTERVAL_START, column)


def require_disjoint(stream: DataFrame, master: DataFrame, stage: str) -> None:
    """Enriched rows take columns from both sides; a shared name would be ambiguous."""
    shared = sorted(set(stream.columns) & set(master.columns))
    if shared:
        raise JoinError(
            f"stage {stage}: master columns {shared} collide with input columns; project "
            "them away in the master's 'columns' or rename them"
        )
