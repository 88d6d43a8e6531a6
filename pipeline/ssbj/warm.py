"""What one process's steps of an SSBJ stage hand to the next, so that a warm process does
not read back what it has just written.

- the new input's Spark schema, by the input table's schema: the step lays out its wide
  table from it, and building the input's DataFrame only to ask its schema costs a step
  that runs in the driver more than the rest of its planning;
- the operator state table at the version this process committed: the next step's plan
  pins that version, and reads it from memory instead of decoding its Parquet files.

Both are keyed by what cannot change under them (a Delta table version is immutable, a
schema is its own key), so an entry is either exact or unused; a process that starts cold
(an Airflow task, a rerun after a crash) reads everything from the tables.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.types import StructType

logger = logging.getLogger(__name__)


@dataclass
class WarmCache:
    """One stage's warm entries in this process (see the module docstring)."""

    input_schemas: dict[str, StructType] = field(default_factory=dict)
    state_version: int | None = None
    state_rows: pa.Table | None = None

    def held_state(self, version: int) -> pa.Table | None:
        """The state table's rows at ``version`` when this process committed that
        version, else None (read it from the table)."""
        if self.state_version is None or self.state_version != int(version):
            return None
        return self.state_rows

    def hold_state(self, version: int | None, rows: pa.Table) -> None:
        """Remember ``rows`` as the state table's content at ``version`` (None: the
        commit's version is not known, so nothing is held)."""
        if version is None:
            self.forget_state()
            return
        self.state_version = int(version)
        self.state_rows = rows

    def forget_state(self) -> None:
        self.state_version = None
        self.state_rows = None
