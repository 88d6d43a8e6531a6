"""The embedded engine's data files: written (by Spark or pyarrow) or linked into a fresh
directory under the table root, each with its Add action, and made durable.

Nothing reads these files until a commit names them: a crash here leaves untracked files
that ``vacuum`` removes, never visible rows. On local disk the files are fsynced before
the commit (:func:`durable`), so a commit never outlives the files it names.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame
from pyspark.sql.types import StructType

from common.phase_clock import PhaseClock, optional_phase
from common.rows import rows_at
from warehouse.delta.api import CommitOutcome, DataFile
from warehouse.delta.file_stats import delta_stats_json
from warehouse.delta.log_writer import sync_files
from warehouse.delta.partition_paths import (
    HIVE_NULL,
    delta_partition_literal,
    partition_values_from_path,
)
from warehouse.delta.schema import spark_to_arrow
from warehouse.object_store import filesystem_of

logger = logging.getLogger(__name__)
# Rows per Parquet file an Arrow write makes at most: a large write becomes several files,
# written side by side (one 800k-row file took one core 0.3 s; Spark writes a file a task).
FILE_ROWS = 262_144
# Pieces are written side by side only when together they hold this many rows. Smaller
# writes (an operator step's state segments) run in the calling thread: a second thread
# gains them nothing (a 48k-row segment took 2-3 ms in either, measured over 10 steps; a
# pooled thread took 12-17 ms before the SSBJ encoder stopped making zeroed null arrays).
PARALLEL_WRITE_ROWS = 2 * FILE_ROWS


@dataclass(frozen=True)
class Written:
    """Data files written for one commit, not yet referenced by the log."""

    adds: tuple[AddAction, ...]
    rows: int

    @classmethod
    def of(cls, added: Sequence[tuple[AddAction, int]]) -> Written:
        """From (Add action, rows) pairs, as :func:`added_file` gives them."""
        return cls(tuple(add for add, _ in added), sum(rows for _, rows in added))

    def outcome(self, version: int) -> CommitOutcome:
        return CommitOutcome(
            table_version=version,
            committed=True,
            files_added=len(self.adds),
            bytes_added=sum(a.size for a in self.adds),
            rows_added=self.rows,
        )


NOTHING_WRITTEN = Written((), 0)


def write_data(
    root: str,
    data: DataFrame | pa.Table,
    schema: StructType,
    partitions: list[str],
    clock: PhaseClock | None,
) -> Written:
    """``data`` in ``schema``'s columns as new files of the table: Spark writes a
    DataFrame's, pyarrow an Arrow table's."""
    if isinstance(data, pa.Table):
        arrow = data.select(schema.fieldNames()).cast(spark_to_arrow(schema))
        return write_arrow_files(root, arrow, partitions, clock)
    return write_files(root, data.select(*schema.fieldNames()), partitions, clock)


def write_arrow_files(
    root: str, data: pa.Table, partitions: list[str], clock: PhaseClock | None
) -> Written:
    """One Parquet file per partition of ``data``, under a fresh folder of the table in
    ``col=value`` directories (values percent-escaped; the log, not the path, holds the
    partition values), each with its Add action."""
    prefix = uuid.uuid4().hex[:20]
    filesystem, base = filesystem_of(f"{root.rstrip('/')}/{prefix}")
    now_ms = int(datetime.now().timestamp() * 1000)

    def write(values: dict[str, Any], rows: pa.Table) -> tuple[AddAction, int]:
        literal = {c: delta_partition_literal(v) for c, v in values.items()}
        directory = "/".join(
            f"{quote(c, safe='')}={HIVE_NULL if v is None else quote(v, safe='')}"
            for c, v in literal.items()
        )
        name = f"part-{uuid.uuid4()}.parquet"
        relative = f"{directory}/{name}" if directory else name
        located = f"{base}/{relative}"
        filesystem.create_dir(os.path.dirname(located), recursive=True)
        with filesystem.open_output_stream(located) as handle:
            footer = write_parquet(rows.drop_columns(partitions), handle)
        size = int(filesystem.get_file_info(located).size or 0)
        return added_file(
            filesystem, located, f"{prefix}/{relative}", size, literal, now_ms, footer
        )

    with optional_phase(clock, "write"):
        pieces = [
            (values, piece)
            for values, rows in partition_groups(data, partitions)
            for piece in file_pieces(rows, FILE_ROWS)
        ]
        if len(pieces) > 1 and sum(p.num_rows for _, p in pieces) >= PARALLEL_WRITE_ROWS:
            # Encoding Parquet releases the GIL: the pieces use every core, as a Spark
            # job's tasks would, and a step's 800k output rows cost half the time.
            workers = min(len(pieces), os.cpu_count() or 1)
            with ThreadPoolExecutor(workers, thread_name_prefix="delta-write") as pool:
                added = list(pool.map(lambda piece: write(*piece), pieces))
        else:
            added = [write(*piece) for piece in pieces]
    logger.debug("wrote %d file(s) under %s/%s", len(added), root, prefix)
    return durable(root, Written.of(added))


def write_files(
    root: str, data: DataFrame, partitions: list[str], clock: PhaseClock | None
) -> Written:
    """``data``'s rows written by Spark's executors into a fresh folder of the table."""
    prefix = uuid.uuid4().hex[:20]
    staging = f"{root.rstrip('/')}/{prefix}"
    writer = data.write.mode("error")  # "errorifexists" is not a Connect mode
    if partitions:
        writer = writer.partitionBy(*partitions)
    with optional_phase(clock, "write"):  # the plan's read and join run here too
        writer.parquet(staging)
    filesystem, base = filesystem_of(staging)
    infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    now_ms = int(datetime.now().timestamp() * 1000)
    added = []
    for info in infos:
        if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
            continue
        relative = os.path.relpath(info.path, base)
        values = partition_values_from_path(os.path.dirname(relative))
        size = int(info.size or 0)
        added.append(
            added_file(filesystem, info.path, f"{prefix}/{relative}", size, values, now_ms)
        )
    logger.debug("wrote %d file(s) under %s", len(added), staging)
    return durable(root, Written.of(added))


def write_one_file(root: str, data: pa.Table, clock: PhaseClock | None) -> Written:
    """``data`` as one Parquet file of an unpartitioned table, written by pyarrow."""
    relative = f"{uuid.uuid4().hex[:20]}/part-00000-{uuid.uuid4()}.parquet"
    location = f"{root.rstrip('/')}/{relative}"
    filesystem, located = filesystem_of(location)
    with optional_phase(clock, "write"):
        filesystem.create_dir(os.path.dirname(located), recursive=True)
        with filesystem.open_output_stream(located) as handle:
            footer = write_parquet(data, handle)
        size = int(filesystem.get_file_info(located).size or 0)
        now_ms = int(datetime.now().timestamp() * 1000)
        return durable(
            root,
            Written.of([added_file(filesystem, located, relative, size, {}, now_ms, footer)]),
        )


def link_files(
    source_root: str, files: Sequence[DataFile], root: str, partitions: list[str]
) -> Written:
    """Give ``files`` names under a fresh directory of ``root``, keeping their partition
    directories; the Add actions that reference them."""
    prefix = uuid.uuid4().hex[:20]
    now_ms = int(datetime.now().timestamp() * 1000)
    added = []
    for file in files:
        relative = os.path.relpath(file.path, source_root)
        if relative.startswith(".."):  # a file the log names by an absolute location
            relative = os.path.basename(file.path)
        destination = f"{root.rstrip('/')}/{prefix}/{relative}"
        link_or_copy(file.path, destination)
        filesystem, located = filesystem_of(destination)
        values = {c: delta_partition_literal(file.partition_values.get(c)) for c in partitions}
        added.append(
            added_file(filesystem, located, f"{prefix}/{relative}", file.size_bytes, values, now_ms)
        )
    logger.debug("linked %d file(s) of %s under %s/%s", len(added), source_root, root, prefix)
    return durable(root, Written.of(added))


def link_or_copy(source: str, destination: str) -> None:
    """A hard link of a local file, else a copy (across file systems, on object stores)."""
    if "://" not in source and "://" not in destination:
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        try:
            os.link(source, destination)
            return
        except OSError as e:  # another device, or a file system without hard links
            logger.debug("cannot link %s (%s); copying it", source, e)
    source_fs, source_path = filesystem_of(source)
    target_fs, target_path = filesystem_of(destination)
    if type(source_fs) is type(target_fs):
        target_fs.create_dir(os.path.dirname(target_path), recursive=True)
        target_fs.copy_file(source_path, target_path)
        return
    pafs.copy_files(
        source_path, target_path, source_filesystem=source_fs, destination_filesystem=target_fs
    )


def added_file(
    filesystem: pafs.FileSystem,
    located: str,
    relative: str,
    size: int,
    partition_values: Mapping[str, str | None],
    now_ms: int,
    footer: pq.FileMetaData | None = None,
) -> tuple[AddAction, int]:
    """The Add action of a written Parquet file (its statistics from its footer, read
    from the file unless the writer gave it) and its rows; ``relative`` is its path under
    the table root."""
    if footer is None:
        with filesystem.open_input_file(located) as handle:
            footer = pq.read_metadata(handle)
    add = AddAction(
        path=relative,
        size=size,
        partition_values=dict(partition_values),
        modification_time=now_ms,
        data_change=True,
        stats=delta_stats_json(footer),
    )
    return add, footer.num_rows


def write_parquet(data: pa.Table, sink: Any) -> pq.FileMetaData:
    """``data`` as one Parquet file into ``sink``; its footer, as the writer made it.

    Only string and binary columns are dictionary-encoded: numbers, timestamps and
    booleans rarely repeat enough to pay for it (a step's output of 18,649 enriched rows
    was written in 2.8 ms instead of 4.7 ms, the file 1.5% larger).

    A nullable column whose every value here is null is left out of the file: Delta
    readers read a column a file lacks as nulls (as in a file written before the column
    was added), and so do Spark, delta-rs and this engine
    (:func:`~warehouse.delta.embedded_reads.arrow_of_files`). The log's statistics then
    say nothing of it. A wide table whose rows each use a few of its columns (an
    operator's state) writes much less: 47,751 counter rows of a 26-column state table in
    2.0 ms instead of 4.0 ms."""
    data = without_null_columns(data)
    collected: list[pq.FileMetaData] = []
    pq.write_table(
        data,
        sink,
        coerce_timestamps="us",
        use_dictionary=[
            f.name
            for f in data.schema
            if pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
            or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type)
        ],
        metadata_collector=collected,
    )
    return collected[0]


def without_null_columns(data: pa.Table) -> pa.Table:
    """``data`` without its nullable columns that hold only nulls (all of them when every
    column does: a Parquet file needs one)."""
    if data.num_rows == 0:
        return data
    kept = [
        f.name
        for f, column in zip(data.schema, data.columns, strict=True)
        if not f.nullable or column.null_count < data.num_rows
    ]
    if not kept or len(kept) == data.num_columns:
        return data
    return data.select(kept)


def partition_groups(
    data: pa.Table, partitions: Sequence[str]
) -> list[tuple[dict[str, Any], pa.Table]]:
    """``data``'s rows by their values of ``partitions`` (one group, no values, when the
    table is not partitioned); no group for no rows. Each row lands in exactly one group:
    the groups are Arrow's own (by value bits, so NaN is one group), and each takes its rows
    by position."""
    if data.num_rows == 0:
        return []
    if not partitions:
        return [({}, data)]
    keys = data.select(list(partitions))
    if all(pc.count_distinct(keys.column(c), mode="all").as_py() == 1 for c in partitions):
        # One group (a step's rows of one interval, say): the table as it is, no take.
        return [(keys.slice(0, 1).to_pylist()[0], data)]
    position = "__row_position"
    indexed = keys.append_column(position, pa.array(np.arange(data.num_rows, dtype=np.int64)))
    grouped = indexed.group_by(list(partitions)).aggregate([(position, "list")])
    lists = grouped.column(f"{position}_list")
    groups = []
    # The positions stay Arrow arrays: a group of 800k rows converted to Python ints and
    # back cost a step 0.3 s.
    for index, key in enumerate(grouped.select(list(partitions)).to_pylist()):
        groups.append((key, rows_at(data, lists[index].values)))
    return groups


def file_pieces(rows: pa.Table, most: int) -> list[pa.Table]:
    """``rows`` in equal slices of at most ``most`` rows (one file each); none for none."""
    if rows.num_rows == 0:
        return []
    count = -(-rows.num_rows // most)
    size = -(-rows.num_rows // count)
    return [rows.slice(start, size) for start in range(0, rows.num_rows, size)]


def durable(root: str, written: Written) -> Written:
    """``written``, its files flushed to disk on a local table (a commit must never outlive
    the files it names); an object store's PUT is durable when it returns."""
    if "://" not in root:
        sync_files(f"{root.rstrip('/')}/{add.path}" for add in written.adds)  # raw names
    return written
