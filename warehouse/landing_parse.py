"""Reading one staged landing file against its stream's declaration, in Spark.

:mod:`warehouse.landing` stages each file that is to load (exactly the bytes whose hash the
ledger holds, see :mod:`warehouse.landing_zone`) and hands the copy here: its columns are
checked against the declared schema (a JSON file's keys, a CSV header, a Parquet footer's
columns and types) before Spark reads it permissively, and :func:`split_records` splits the
parsed rows into valid ones and (record, reason) rows for the ingest quarantine. A check
that fails raises an :class:`~common.errors.IngestionError` naming the landing file; the
caller rejects that file whole. The staged copy may be on local disk or in an object store:
the driver's checks read it through :meth:`StagedCopy.open`, Spark through its URL.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import SchemaDriftError, UnreadableFileError
from warehouse.delta.file_stats import column_stats
from warehouse.delta.schema import arrow_to_spark
from warehouse.landing_zone import StagedCopy
from warehouse.record_identity import (
    RESENT,
    IdRange,
    KnownRecords,
    conflict_message,
    identity_reason,
    resent_message,
    with_known,
)

CORRUPT = "_corrupt_record"
FORMAT_NAMES = {"csv": "CSV", "json": "JSON", "parquet": "Parquet"}
# JSON files up to this size have their keys checked in the driver (``_json_keys_in_driver``).
DRIVER_JSON_BYTES = 128 * 1024**2


@dataclass(frozen=True)
class StreamSource:
    """What ingestion needs to know about one stream."""

    name: str
    landing_dir: Path
    """The landing directory; for an object-store prefix ``Path("s3://bucket/prefix")``,
    which :func:`warehouse.landing_location.zone_for` reads back as that location."""
    format: str
    schema: T.StructType
    required: tuple[str, ...]
    bronze_path: str
    quarantine_path: str
    bronze_schema: T.StructType
    quarantine_schema: T.StructType
    csv_header: bool = True
    csv_delimiter: str = ","
    id_column: str | None = None
    """A record's id across files (the stream's ``id_column``): re-sent records are not
    loaded twice (:mod:`warehouse.record_identity`). None: every record is new."""


def split_records(
    parsed: DataFrame,
    schema: T.StructType,
    required: tuple[str, ...],
    counts: Observation | None = None,
    known: KnownRecords | None = None,
    keep: Sequence[str] = (),
) -> tuple[DataFrame, DataFrame]:
    """Split parsed rows into valid rows and (record, reason) rows for quarantine.

    With ``known`` (bronze's records under the file's ids), a record whose id is among
    them is a re-send or a conflict (:mod:`warehouse.record_identity`), not valid.
    With ``counts``, every row is counted as it passes (``received``; ``bad``: those
    given a reason; ``resent``: the re-sends among them), whichever frame is computed.
    ``keep``: columns of ``parsed`` beyond the declared ones that both frames carry along
    (the file a row came from, when several files are read at once).
    """
    columns = schema.fieldNames()
    corrupt = F.col(CORRUPT).isNotNull()
    missing = [F.when(F.col(c).isNull(), F.lit(c)) for c in required]
    missing_list = F.concat_ws(", ", *missing) if missing else F.lit("")
    reason = F.when(corrupt, F.lit("malformed: does not parse against the declared schema")).when(
        missing_list != "", F.concat(F.lit("null in required column(s): "), missing_list)
    )
    if known is not None:
        parsed = with_known(parsed, known, columns)
        resent, conflict = identity_reason(columns)
        reason = reason.when(resent, resent_message(known.id_column)).when(
            conflict, conflict_message(known.id_column)
        )
    tagged = parsed.withColumn("reason", reason.otherwise(F.lit(None)))
    if counts is not None:
        tagged = tagged.observe(
            counts,
            F.count(F.lit(1)).alias("received"),
            F.sum(F.col("reason").isNotNull().cast(T.LongType())).alias("bad"),
            F.sum(F.col("reason").startswith(RESENT).cast(T.LongType())).alias("resent"),
        )
    valid = tagged.where(F.col("reason").isNull()).select(*columns, *keep)
    malformed = tagged.where(F.col("reason").isNotNull()).select(
        F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*columns))).alias("record"), "reason", *keep
    )
    return valid, malformed


@dataclass(frozen=True)
class ParsedFile:
    """A checked staged file, read lazily: Spark plans its read (a listing and a schema
    resolution, about 0.1 s) only when :attr:`frame` is asked for, which a file loaded with
    others in one scan (:func:`read_parquet`) never is. Its id range when its checks found
    it; its row count when its format states one (a Parquet footer)."""

    read: Callable[[], DataFrame]
    ids: IdRange | None = None
    ids_checked: bool = False  # True: ``ids`` is the file's id range (None: no ids)
    rows: int | None = None
    required_nulls: int | None = None
    """Nulls in the declared required columns, by the footer's statistics (None: unknown)."""

    @cached_property
    def frame(self) -> DataFrame:
        return self.read()


def read_parquet(spark: SparkSession, source: StreamSource, urls: Sequence[str]) -> DataFrame:
    """One scan of checked Parquet files (their staged copies' URLs), in the shape
    :func:`split_records` takes: the declared columns and a null corrupt-record column
    (Parquet's types were checked against the footer, so no record is unparsed)."""
    return (
        spark.read.schema(source.schema)
        .parquet(*urls)
        .withColumn(CORRUPT, F.lit(None).cast(T.StringType()))
    )


def parse_staged(
    spark: SparkSession, source: StreamSource, staged: StagedCopy, path: str
) -> ParsedFile:
    """Check the staged copy ``staged`` of landing file ``path`` (named in messages); its
    read is planned when first asked for."""
    with_corrupt = T.StructType(
        [*source.schema.fields, T.StructField(CORRUPT, T.StringType(), True)]
    )
    if source.format == "json":
        checked = _check_json_keys(spark, source, staged, path)
        return ParsedFile(
            lambda: (
                spark.read.schema(with_corrupt)
                .option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT)
                .json(staged.url)
            ),
            checked.ids,
            checked.ids_checked,
        )
    if source.format == "csv":
        _check_csv_header(source, staged, path)
        return ParsedFile(
            lambda: (
                spark.read.schema(with_corrupt)
                .option("header", source.csv_header)
                .option("sep", source.csv_delimiter)
                .option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT)
                .csv(staged.url)
            )
        )
    footer = _check_parquet_schema(source, staged, path)
    url = staged.url
    rows, nulls = footer.num_rows, _required_nulls(footer, source.required)
    # The footer's statistics state the id range when every row group has them.
    stats = column_stats(footer).get(source.id_column) if source.id_column else None
    if stats is None or stats.min is None or stats.max is None:
        return ParsedFile(
            lambda: read_parquet(spark, source, [url]), rows=rows, required_nulls=nulls
        )
    return ParsedFile(
        lambda: read_parquet(spark, source, [url]),
        IdRange(stats.min, stats.max),
        ids_checked=True,
        rows=rows,
        required_nulls=nulls,
    )


def _required_nulls(footer: pq.FileMetaData, required: Sequence[str]) -> int | None:
    """The nulls of ``required`` columns in a Parquet file, summed over its row groups from
    their statistics; None when a row group does not state a count."""
    index = {footer.schema.column(i).path: i for i in range(footer.num_columns)}
    total = 0
    for group in range(footer.num_row_groups):
        for name in required:
            if name not in index:
                return None
            stats = footer.row_group(group).column(index[name]).statistics
            if stats is None or not stats.has_null_count:
                return None
            total += stats.null_count
    return total


def count_records(
    parsed: DataFrame, source: StreamSource, known: KnownRecords | None
) -> tuple[int, int, int]:
    """(records, records not loaded, re-sent records among those) of a parsed file."""
    _, rejected = split_records(parsed, source.schema, source.required, known=known)
    found = parsed.agg(F.count(F.lit(1)).alias("n")).first()
    reasons = rejected.agg(
        F.count(F.lit(1)).alias("bad"),
        F.sum(F.col("reason").startswith(RESENT).cast(T.LongType())).alias("resent"),
    ).first()
    bad = int(reasons["bad"]) if reasons else 0
    resent = int(reasons["resent"] or 0) if reasons else 0
    return int(found["n"] if found else 0), bad, resent


def unreadable(error: Py4JJavaError, source: StreamSource, path: str) -> UnreadableFileError:
    """A file Spark cannot decode, as an ingestion error; any other failure (memory, a lost
    executor) is not the file's fault and propagates."""
    # Spark tags a failure to read or decode an input file with this error class.
    if "[FAILED_READ_FILE" not in str(error.java_exception):
        raise error
    return UnreadableFileError(
        f"{path}: cannot be read as {FORMAT_NAMES[source.format]}: "
        f"{_root_cause(error.java_exception)}. The file is left in place; fix the producer."
    )


def _root_cause(throwable: object) -> str:
    """The innermost Java exception message (``throwable`` is a py4j proxy)."""
    cause: object = throwable
    for _ in range(16):
        inner = cause.getCause()  # type: ignore[attr-defined]
        if inner is None:
            break
        cause = inner
    return str(cause)


def _drift(source: StreamSource, path: str, found: list[str], detail: str = "") -> SchemaDriftError:
    expected = source.schema.fieldNames()
    extra = [c for c in found if c not in expected]
    missing = [c for c in expected if c not in found]
    return SchemaDriftError(
        f"{path}: columns do not match stream {source.name!r}: expected {expected}, found "
        f"{found}"
        + (f"; unexpected {extra}" if extra else "")
        + (f"; missing {missing}" if missing else "")
        + (f"; {detail}" if detail else "")
        + ". The file is left in place; fix the producer or the declared schema."
    )


def _check_json_keys(
    spark: SparkSession, source: StreamSource, staged: StagedCopy, path: str
) -> _JsonCheck:
    """Check the keys of a JSON lines file against the declaration, and find the range of
    the stream's ids as the file spells them: in the driver with Arrow's JSON reader when
    the file is small and every line parses (no Spark job), else in one Spark job."""
    checked = _json_keys_in_driver(source, staged)
    if checked is None:
        checked = _json_keys_in_spark(spark, source, staged)
    keys = checked.keys
    expected = set(source.schema.fieldNames())
    unexpected = [k for k in keys if k not in expected]
    absent_required = [c for c in source.required if keys and c not in keys]
    if unexpected or absent_required:
        raise _drift(source, path, sorted(keys))
    return checked


@dataclass(frozen=True)
class _JsonCheck:
    """The keys a JSON lines file uses, and its id range when that was found."""

    keys: list[str]
    ids: IdRange | None = None
    ids_checked: bool = False  # True: ``ids`` is the range (None: no id in the file)


def _json_keys_in_driver(source: StreamSource, staged: StagedCopy) -> _JsonCheck | None:
    """Arrow's JSON reader (C++, multi-threaded: 0.06 s for 100k lines against 0.5-0.8 s
    for a Spark job) over a file of at most :data:`DRIVER_JSON_BYTES`; None when the file
    is larger or Arrow cannot read every line (a malformed record, a value whose type
    changes between lines): Spark's permissive reader decides those."""
    if staged.size_bytes > DRIVER_JSON_BYTES:
        return None
    try:
        with staged.open() as handle:
            table = pa_json.read_json(handle)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError):
        return None
    keys = table.schema.names
    id_column = source.id_column
    if id_column is None or id_column not in keys:
        return _JsonCheck(keys, None, ids_checked=id_column is not None)
    values = table.column(id_column)
    declared = source.schema[id_column].dataType
    integral = isinstance(declared, T.ByteType | T.ShortType | T.IntegerType | T.LongType)
    if not (
        (integral and pa.types.is_integer(values.type))
        or (isinstance(declared, T.StringType) and pa.types.is_string(values.type))
        or pa.types.is_null(values.type)
    ):
        return _JsonCheck(keys)  # the range is left to the parsed frame
    low_high = pc.min_max(values)
    low, high = low_high["min"].as_py(), low_high["max"].as_py()
    return _JsonCheck(keys, None if low is None else IdRange(low, high), ids_checked=True)


def _json_keys_in_spark(
    spark: SparkSession, source: StreamSource, staged: StagedCopy
) -> _JsonCheck:
    lines = spark.read.text(staged.url)
    found = [F.array_distinct(F.flatten(F.collect_set(F.json_object_keys("value")))).alias("k")]
    if source.id_column is not None:
        kind = source.schema[source.id_column].dataType
        # A superset of the ids that will parse: a record that will not parse may add its
        # id (or nothing, where its text does not cast: try_cast, as ANSI casts would fail
        # the job) to the range, never remove one.
        text_id = F.get_json_object("value", f"$.{source.id_column}").try_cast(kind)
        found += [F.min(text_id).alias("low"), F.max(text_id).alias("high")]
    row = lines.agg(*found).first()
    keys = list(row["k"] or []) if row else []
    if source.id_column is None:
        return _JsonCheck(keys)
    ids = None if row is None or row["low"] is None else IdRange(row["low"], row["high"])
    return _JsonCheck(keys, ids, ids_checked=True)


def _check_csv_header(source: StreamSource, staged: StagedCopy, path: str) -> None:
    if not source.csv_header:
        return
    # Admission has checked that the bytes are UTF-8.
    with staged.open() as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as handle:
        header = next(csv.reader(handle, delimiter=source.csv_delimiter), [])
    if [h.strip() for h in header] != source.schema.fieldNames():
        raise _drift(source, path, [h.strip() for h in header])


def _check_parquet_schema(source: StreamSource, staged: StagedCopy, path: str) -> pq.FileMetaData:
    """Check a Parquet file's columns and types against the declaration; its footer."""
    try:
        with staged.open() as handle:
            metadata = pq.read_metadata(handle)
        found = arrow_to_spark(metadata.schema.to_arrow_schema())
    except (pa.ArrowException, OSError) as e:  # empty, truncated, not Parquet at all
        raise UnreadableFileError(
            f"{path}: cannot be read as Parquet: {e}. The file is left in place; fix the producer."
        ) from e
    names = found.fieldNames()
    if sorted(names) != sorted(source.schema.fieldNames()):
        raise _drift(source, path, names)
    changed = [
        f"{f.name}: declared {source.schema[f.name].dataType.simpleString()}, "
        f"file has {f.dataType.simpleString()}"
        for f in found.fields
        if f.dataType != source.schema[f.name].dataType
    ]
    if changed:
        raise _drift(source, path, names, "; ".join(changed))
    return metadata
