"""Measured bytes per row: the in-memory (Arrow) size of a sample of projected rows."""

from __future__ import annotations

from pyspark.sql import DataFrame

SIZE_SAMPLE_ROWS = 2000


def measured_row_bytes(frame: DataFrame, sample_rows: int = SIZE_SAMPLE_ROWS) -> float | None:
    """Arrow bytes per row of up to ``sample_rows`` rows; None when the frame is empty."""
    sample = frame.limit(sample_rows).toArrow()
    return sample.nbytes / sample.num_rows if sample.num_rows else None
