"""Measured bytes per row: the in-memory (Arrow) size of a sample of projected rows."""

from __future__ import annotations

from functools import cached_property

from pyspark.sql import DataFrame

SIZE_SAMPLE_ROWS = 2000


def measured_row_bytes(frame: DataFrame, sample_rows: int = SIZE_SAMPLE_ROWS) -> float | None:
    """Arrow bytes per row of up to ``sample_rows`` rows; None when the frame is empty."""
    sample = frame.limit(sample_rows).toArrow()
    return sample.nbytes / sample.num_rows if sample.num_rows else None


class MeasuredRowBytes:
    """Both sides' measured bytes per row (``joins.theta.join.RowBytes``), each measured on
    first use only: a join whose scheme needs neither (binning, Spark's own join) runs no
    job for them."""

    def __init__(self, stream: DataFrame, master: DataFrame) -> None:
        self._stream, self._master = stream, master

    @cached_property
    def _stream_bytes(self) -> float:
        return measured_row_bytes(self._stream) or 1.0

    @cached_property
    def _master_bytes(self) -> float:
        return measured_row_bytes(self._master) or 1.0

    def stream(self) -> float:
        return self._stream_bytes

    def master(self) -> float:
        return self._master_bytes
