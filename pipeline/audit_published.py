"""The audit's published view: which tuples it accounts for already have rows in an
earlier batch of their output, published or quarantined.

Only the files that may hold rows of the tuples' oldest interval or later are read
(partition values and log statistics), so a live audit reads none of gold's past
intervals. Built as a Spark frame or in the driver's memory, as the batch is validated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from joins.columns import INTERVAL_START
from pipeline.layout import WarehouseLayout
from quality.audit_views import (
    no_published,
    no_published_arrow,
    oldest_interval_arrow,
    published_tuples,
    published_tuples_arrow,
)
from warehouse.delta import DataFile, DeltaEngine, Snapshot


@dataclass(frozen=True)
class PublishedTuples:
    """The published view of an output table's audit, from its earlier batches' tables."""

    spark: SparkSession
    engine: DeltaEngine
    layout: WarehouseLayout

    def view(
        self, table: str, id_column: str, input_rows: DataFrame, waiting: DataFrame | None
    ) -> DataFrame:
        """Ids of the tuples this audit accounts for that have rows in an earlier batch,
        published or quarantined.

        Those are the tuples that were waiting at the last audit (a left-join tuple matched
        earlier has nothing left to emit at expiry; its rows may sit in a quarantined batch
        until someone resolves it) and the new tuples of an interval a backfill has already
        published. Only the files of those tables that may hold rows of the tuples' oldest
        interval or later are read (partition values and log statistics): a live audit
        reads none of gold's past intervals, whatever gold's size.
        """
        id_type = input_rows.schema[id_column].dataType
        earlier = self._earlier_tables(table)
        if not earlier:
            return no_published(self.spark, id_type)
        tuples = input_rows.select(id_column, INTERVAL_START)
        if waiting is not None:
            tuples = tuples.unionByName(waiting.select(id_column, INTERVAL_START))
        first = tuples.agg(F.min(INTERVAL_START).alias("oldest")).first()  # one small job
        oldest = None if first is None else first["oldest"]
        if oldest is None:
            return no_published(self.spark, id_type)
        found = [
            published_tuples(self.engine.read_files(snapshot, files), tuples, id_column)
            for snapshot, files in self._files_since(earlier, oldest)
        ]
        if not found:
            return no_published(self.spark, id_type)
        return found[0] if len(found) == 1 else found[0].unionByName(found[1]).distinct()

    def view_arrow(
        self, table: str, id_column: str, tuples: pa.Table, waiting: pa.Table | None
    ) -> pa.Table:
        """:meth:`view` in the driver's memory: the same files, read with only
        the id and interval columns."""
        id_type = tuples.schema.field(id_column).type
        asked = tuples.select([id_column, INTERVAL_START])
        if waiting is not None:
            asked = pa.concat_tables(
                [asked, waiting.select([id_column, INTERVAL_START]).cast(asked.schema)]
            )
        oldest = oldest_interval_arrow([asked])
        if oldest is None:
            return no_published_arrow(id_type)
        found = []
        for snapshot, files in self._files_since(self._earlier_tables(table), oldest):
            columns = [c for c in (id_column, INTERVAL_START) if c in snapshot.schema.names]
            rows = self.engine.read_arrow(snapshot, files, columns)
            found.append(published_tuples_arrow(rows, asked, id_column, oldest))
        if not found:
            return no_published_arrow(id_type)
        ids = pa.concat_tables(found)
        return ids if len(found) == 1 else ids.group_by([ids.column_names[0]]).aggregate([])

    def _earlier_tables(self, table: str) -> list[str]:
        """The tables holding ``table``'s earlier batches (published, quarantined) that exist."""
        return [
            path
            for path in (self.layout.published(table), self.layout.quarantined_output(table))
            if self.engine.exists(path)
        ]

    def _files_since(
        self, paths: list[str], oldest: datetime
    ) -> list[tuple[Snapshot, list[DataFile]]]:
        """Each table's latest snapshot and its files that may hold rows of ``oldest``'s
        interval or later (partition values and log statistics), for the tables with any."""
        found = []
        for path in paths:
            snapshot = self.engine.snapshot(path)
            files = [f for f in snapshot.files if f.may_hold_since(INTERVAL_START, oldest)]
            if files:
                found.append((snapshot, files))
        return found
