"""The audit's published view: which tuples it accounts for already have rows in an
earlier batch of their output, published or quarantined.

Only the files that may hold rows of the tuples' oldest interval or later are read
(partition values and log statistics), so a live audit reads none of gold's past
intervals. Written once over :class:`common.rows.Rows`: read with Spark or into the
driver's memory, as the batch is validated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import narwhals.stable.v2 as nw
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from common.rows import Frame, Rows
from joins.columns import INTERVAL_START
from pipeline.layout import WarehouseLayout
from quality.audit_views import no_published, published_tuples
from warehouse.delta import DataFile, DeltaEngine, Snapshot


@dataclass(frozen=True)
class PublishedTuples:
    """The published view of an output table's audit, from its earlier batches' tables."""

    spark: SparkSession
    engine: DeltaEngine
    layout: WarehouseLayout

    def view(self, table: str, id_column: str, tuples: Rows, waiting: Rows | None) -> Rows:
        """Ids of the tuples this audit accounts for that have rows in an earlier batch,
        published or quarantined.

        Those are the tuples that were waiting at the last audit (a left-join tuple matched
        earlier has nothing left to emit at expiry; its rows may sit in a quarantined batch
        until someone resolves it) and the new tuples of an interval a backfill has already
        published. Only the files of those tables that may hold rows of the tuples' oldest
        interval or later are read (partition values and log statistics), with only the id
        and interval columns: a live audit reads none of gold's past intervals, whatever
        gold's size.
        """
        asked = Rows.apply(_asked, tuples, waiting, id_column=id_column)
        earlier = self._earlier_tables(table)
        if not earlier:
            return no_published(tuples, id_column)
        published = Rows.read(
            arrow=lambda: self._read_arrow(earlier, id_column, asked.to_arrow()),
            spark=lambda: self._read_spark(earlier, id_column, asked.to_spark()),
        )
        return published_tuples(published, asked, id_column)

    def _read_arrow(self, paths: list[str], id_column: str, asked: pa.Table) -> pa.Table:
        oldest = pc.min(asked.column(INTERVAL_START)).as_py() if asked.num_rows else None
        found = [
            self.engine.read_arrow(snapshot, files, _columns(snapshot, id_column))
            for snapshot, files in self._files_since(paths, oldest)
        ]
        return pa.concat_tables(found, promote_options="default") if found else asked.slice(0, 0)

    def _read_spark(self, paths: list[str], id_column: str, asked: DataFrame) -> DataFrame:
        first = asked.agg(F.min(INTERVAL_START).alias("oldest")).first()  # one small job
        oldest = None if first is None else first["oldest"]
        found = asked.limit(0)
        for snapshot, files in self._files_since(paths, oldest):
            rows = self.engine.read_files(snapshot, files).select(*_columns(snapshot, id_column))
            found = found.unionByName(rows, allowMissingColumns=True)
        return found

    def _earlier_tables(self, table: str) -> list[str]:
        """The tables holding ``table``'s earlier batches (published, quarantined) that exist."""
        return [
            path
            for path in (self.layout.published(table), self.layout.quarantined_output(table))
            if self.engine.exists(path)
        ]

    def _files_since(
        self, paths: list[str], oldest: datetime | None
    ) -> list[tuple[Snapshot, list[DataFile]]]:
        """Each table's latest snapshot and its files that may hold rows of ``oldest``'s
        interval or later (partition values and log statistics), for the tables with any;
        none when there is no oldest interval (no tuple is asked about)."""
        found: list[tuple[Snapshot, list[DataFile]]] = []
        if oldest is None:
            return found
        for path in paths:
            snapshot = self.engine.snapshot(path)
            files = [f for f in snapshot.files if f.may_hold_since(INTERVAL_START, oldest)]
            if files:
                found.append((snapshot, files))
        return found


def _asked(tuples: Frame, waiting: Frame | None, id_column: str) -> Frame:
    """The ids and intervals of the tuples the audit asks about."""
    asked = tuples.select(id_column, INTERVAL_START)
    if waiting is None:
        return asked
    schema = asked.collect_schema()
    return nw.concat([asked, waiting.select(*(nw.col(n).cast(t) for n, t in schema.items()))])


def _columns(snapshot: Snapshot, id_column: str) -> list[str]:
    return [c for c in (id_column, INTERVAL_START) if c in snapshot.schema.names]
