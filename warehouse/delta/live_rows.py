"""The rows a live pipeline reads and publishes: what tables added, but not backfills.

A backfill tags its commits with ``OPERATION_KEY = BACKFILL`` (:func:`operation`); the rows
those commits added are never new rows of a live batch or a stage's input, so every read
here leaves them out. Each read comes as :class:`~common.rows.Rows`, read into the driver
or as a Spark frame as its consumer asks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from warehouse.delta.api import (
    BACKFILL,
    COMMIT_VERSION,
    OPERATION_KEY,
    AppTransaction,
    CommitOutcome,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from common.rows import Rows
    from warehouse.delta.engine import DeltaEngine


@contextmanager
def operation(engine: DeltaEngine, name: str) -> Iterator[None]:
    """Tag every commit ``engine`` makes inside the block with ``OPERATION_KEY = name``."""
    before = engine.commit_metadata
    engine.commit_metadata = {**before, OPERATION_KEY: name}
    try:
        yield
    finally:
        engine.commit_metadata = before


def table_rows(
    engine: DeltaEngine, path: str, version: int | None = None, columns: Sequence[str] | None = None
) -> Rows:
    """The rows of ``path`` at ``version`` (the latest when None; only ``columns`` when
    given), read into the driver or as a Spark frame, as the consumer asks."""
    from common.rows import Rows  # here: the protocol's importers need no Spark or Arrow

    snapshot = engine.snapshot(path, version)

    def on_spark() -> DataFrame:
        rows = engine.read(path, version=snapshot.version)
        return rows if columns is None else rows.select(*columns)

    return Rows.read(arrow=lambda: engine.read_arrow(snapshot, columns=columns), spark=on_spark)


def live_rows_added(
    engine: DeltaEngine, path: str, after_version: int, to_version: int, with_version: bool = False
) -> Rows:
    """Rows a live consumer has not seen: added in (after, to], still live, not a backfill's;
    read into the driver or as a Spark frame, as the consumer asks.

    Rows of a file a later commit of the range replaced are left out (the replacing
    backfill re-joined them and published them itself), and so are the files backfill
    commits added. With ``with_version`` each row carries ``_commit_version``.
    """
    from common.rows import Rows  # here: the protocol's importers need no Spark or Arrow

    def on_spark() -> DataFrame:
        skip = _backfill_versions(engine, path, after_version, to_version)
        rows = engine.rows_added(path, after_version, to_version, skip_versions=skip)
        return rows if with_version else rows.drop(COMMIT_VERSION)

    def in_driver() -> pa.Table:
        skip = _backfill_versions(engine, path, after_version, to_version)
        return engine.rows_added_arrow(path, after_version, to_version, skip, with_version)

    return Rows.read(arrow=in_driver, spark=on_spark)


def append_live_rows_added(
    engine: DeltaEngine,
    source: str,
    after_version: int,
    to_version: int,
    target: str,
    txn: AppTransaction,
    partition_by: Sequence[str],
) -> CommitOutcome:
    """Append what :func:`live_rows_added` returns to ``target``: the publish of a batch."""
    skip = _backfill_versions(engine, source, after_version, to_version)
    return engine.append_rows_added(
        source, after_version, to_version, target, txn, skip, partition_by
    )


def rows_committed(engine: DeltaEngine, path: str, after_version: int, to_version: int) -> int:
    """Rows the data files of versions ``(after, to]`` added, from the log alone."""
    return sum(rows for _, rows in engine.rows_by_version(path, after_version, to_version))


def count_live_rows_added(
    engine: DeltaEngine, path: str, after_version: int, to_version: int
) -> int | None:
    """How many rows :func:`live_rows_added` returns, from the log alone (None: unknown)."""
    skip = _backfill_versions(engine, path, after_version, to_version)
    return engine.count_rows_added(path, after_version, to_version, skip_versions=skip)


def _backfill_versions(
    engine: DeltaEngine, path: str, after_version: int, to_version: int
) -> list[int]:
    """The versions in (after, to] that backfills committed."""
    if to_version <= after_version:
        return []
    return [
        version
        for version, info in engine.commit_infos(path, after_version, to_version)
        if info.get(OPERATION_KEY) == BACKFILL
    ]
