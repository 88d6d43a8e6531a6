"""The quality gate of one output table, as the config declares it."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from common.model import Identifier, Strict


class QualityConfig(Strict):
    """The quality gate of one output table: suites by name, and config-driven checks."""

    suites: list[str] = Field(default_factory=list, description="suite files in expectations_dir")
    warn_only: bool = Field(
        default=False, description="publish even when a suite fails (the run logs a warning)"
    )
    value_ranges: dict[Identifier, tuple[float | None, float | None]] = Field(default_factory=dict)
    value_sets: dict[Identifier, list[Any]] = Field(default_factory=dict)
    in_memory_max_rows: int = Field(
        default=1_000_000,
        ge=0,
        description="a batch of at most this many rows whose expectations the driver can "
        "decide (quality.batch_engine) is validated in memory: GX's pandas engine, DuckDB "
        "for SQL expectations, Spark types against the schema; instead of a Spark job per "
        "metric. 0 keeps every batch on Spark",
    )

    @property
    def checked(self) -> bool:
        """Whether anything checks the table: a named suite or a config-declared check."""
        return bool(self.suites or self.value_ranges or self.value_sets)
