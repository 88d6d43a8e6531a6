"""What one process's steps of an SSBJ stage hand to the next, so that a warm process does
not read back what it has just written.

- the new input's Spark schema, by the input table's schema: the step lays out its wide
  table from it, and building the input's DataFrame only to ask its schema costs a step
  that runs in the driver more than the rest of its planning;
- the operator state table at the version this process committed: the next step's plan
  pins that version, and reads it from memory instead of decoding its Parquet files.

Both are keyed by what cannot change under them (a Delta table version, with its commit
file's identity, which a table created again at the path does not share; a schema is its
own key), so an entry is either exact or unused (on an object store the identity is the
commit object's ETag: a HEAD request a step). A
process that starts cold (an Airflow task, a rerun after a crash) reads everything from
the tables.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.types import StructType

from warehouse.delta.table_paths import table_root
from warehouse.delta.version_cache import CommitStamp, commit_stamp

logger = logging.getLogger(__name__)


@dataclass
class WarmCache:
    """One stage's warm entries in this process (see the module docstring)."""

    input_schemas: dict[str, StructType] = field(default_factory=dict)
    state_version: int | None = None
    # The version's commit file as it was when held (inode, size, mtime; or ETag, size): a
    # table deleted and created again at the path has another, and its rows are not these.
    state_stamp: CommitStamp | None = None
    state_rows: pa.Table | None = None

    def held_state(self, path: str, version: int) -> pa.Table | None:
        """The rows of the state table at ``path`` at ``version`` when this process
        committed that version, else None (read it from the table)."""
        if self.state_version is None or self.state_version != int(version):
            return None
        if commit_stamp(table_root(path), int(version)) != self.state_stamp:
            self.forget_state()
            return None
        return self.state_rows

    def hold_state(self, path: str, version: int | None, rows: pa.Table) -> None:
        """Remember ``rows`` as the content of the state table at ``path`` at ``version``
        (None: the commit's version is not known, or its commit file cannot be found): its
        commit file says whether the version is still the one written."""
        stamp = None if version is None else commit_stamp(table_root(path), int(version))
        if version is None or stamp is None:
            self.forget_state()
            return
        self.state_version = int(version)
        self.state_stamp = stamp
        self.state_rows = rows

    def forget_state(self) -> None:
        self.state_version = None
        self.state_stamp = None
        self.state_rows = None
