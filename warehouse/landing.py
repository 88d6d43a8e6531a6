"""Landing-zone ingestion: complete micro-batch files into a stream's bronze Delta table.

Contract:

- Producers place files atomically. Names starting with ``_`` or ``.`` are in progress and
  ignored, as are directories.
- Each file is registered in the state store's ledger once, by (stream, path) with its size
  and SHA-256. A re-delivered identical file is skipped with a log line; different content
  under a known name raises :class:`ChangedFileError` and nothing of it is loaded.
- Files are loaded in ledger order, one bronze commit per file, with the app transaction
  ``ingest.<stream>`` at the file's ledger id. A crash anywhere leaves the file
  ``registered``; the next run resumes it and the transaction id makes the commit land once.
- Records that do not parse against the declared schema, or have nulls in required
  columns, go to the quarantine table with the raw record, the reason and the source file.
- A file whose columns differ from the declaration is rejected whole (ledger status
  ``rejected``, error recorded) and stays where it is.
"""

from __future__ import annotations

import csv
import hashlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from common.errors import SchemaDriftError
from warehouse.delta import AppTransaction, DeltaEngine
from warehouse.delta.schema import arrow_to_spark
from warehouse.state_store import LandingFile, StateStore

logger = logging.getLogger(__name__)

CORRUPT = "_corrupt_record"
SOURCE_FILE = "_source_file"
BATCH_ID = "_batch_id"


@dataclass(frozen=True)
class StreamSource:
    """What ingestion needs to know about one stream."""

    name: str
    landing_dir: Path
    format: str
    schema: T.StructType
    required: tuple[str, ...]
    bronze_path: str
    quarantine_path: str
    bronze_schema: T.StructType
    quarantine_schema: T.StructType
    csv_header: bool = True
    csv_delimiter: str = ","


@dataclass
class IngestReport:
    stream: str
    files_loaded: int = 0
    files_skipped: int = 0
    files_rejected: int = 0
    records_received: int = 0
    records_loaded: int = 0
    records_quarantined: int = 0
    errors: list[str] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        return {
            "files_loaded": self.files_loaded,
            "files_skipped": self.files_skipped,
            "files_rejected": self.files_rejected,
            "records_received": self.records_received,
            "records_loaded": self.records_loaded,
            "records_quarantined": self.records_quarantined,
        }


def discover_files(landing_dir: Path) -> list[Path]:
    """Complete files of a landing directory, oldest first."""
    if not landing_dir.exists():
        return []
    files = [
        p
        for p in landing_dir.rglob("*")
        if p.is_file()
        and not any(part.startswith(("_", ".")) for part in p.relative_to(landing_dir).parts)
    ]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ingest_stream(
    spark: SparkSession,
    engine: DeltaEngine,
    store: StateStore,
    source: StreamSource,
    run_id: str,
) -> IngestReport:
    """Load every new complete file of one stream; see the module docstring for guarantees."""
    report = IngestReport(source.name)
    engine.create_table(source.bronze_path, source.bronze_schema)
    engine.create_table(source.quarantine_path, source.quarantine_schema)
    pending: list[LandingFile] = list(store.landing_files(source.name, status="registered"))
    known_paths = {row.path for row in pending}
    for path in discover_files(source.landing_dir):
        size, digest = path.stat().st_size, file_digest(path)
        known = store.landing_file(source.name, str(path))
        if known is None:
            pending.append(
                store.register_landing_file(source.name, str(path), size, digest, run_id)
            )
            continue
        if known.sha256 != digest or known.size_bytes != size:
            message = (
                f"{path}: content changed since it was registered on "
                f"{known.registered_at:%Y-%m-%d %H:%M:%S} (sha256 {known.sha256[:12]}…, "
                f"{known.size_bytes} bytes; now {digest[:12]}…, {size} bytes). "
                "Deliver corrections under a new file name."
            )
            logger.error("%s", message)
            report.errors.append(message)
            pending = [p for p in pending if p.path != str(path)]
            continue
        if str(path) not in known_paths:
            logger.info("skip %s: already %s (ledger id %d)", path, known.status, known.id)
            report.files_skipped += 1
    for entry in sorted(pending, key=lambda row: row.id):
        _ingest_file(spark, engine, store, source=source, entry=entry, report=report)
    logger.info(
        "ingest %s: %d file(s) loaded, %d skipped, %d rejected; %d record(s) received, "
        "%d loaded, %d quarantined",
        source.name,
        report.files_loaded,
        report.files_skipped,
        report.files_rejected,
        report.records_received,
        report.records_loaded,
        report.records_quarantined,
    )
    return report


def _ingest_file(
    spark: SparkSession,
    engine: DeltaEngine,
    store: StateStore,
    *,
    source: StreamSource,
    entry: LandingFile,
    report: IngestReport,
) -> None:
    path = Path(entry.path)
    try:
        parsed = _parse(spark, source, path)
    except SchemaDriftError as e:
        logger.error("reject %s: %s", path, e)
        store.update_landing_file(
            entry.id, status="rejected", error=str(e), finished_at=datetime.now(UTC)
        )
        report.files_rejected += 1
        report.errors.append(str(e))
        return
    parsed = parsed.cache()
    try:
        valid, malformed = split_records(parsed, source.schema, source.required)
        stamped = valid.withColumn(SOURCE_FILE, F.lit(str(path))).withColumn(
            BATCH_ID, F.lit(entry.id).cast(T.LongType())
        )
        quarantined = malformed.select(
            F.lit(source.name).alias("stream"),
            F.lit(str(path)).alias("source_file"),
            F.col("record"),
            F.col("reason"),
            F.lit(entry.id).cast(T.LongType()).alias(BATCH_ID),
            F.current_timestamp().alias("quarantined_at"),
        )
        received = parsed.count()
        bad = quarantined.count()
        engine.append(
            source.bronze_path, stamped, AppTransaction(f"ingest.{source.name}", entry.id)
        )
        engine.append(
            source.quarantine_path,
            quarantined,
            AppTransaction(f"quarantine.{source.name}", entry.id),
        )
    finally:
        parsed.unpersist()
    store.update_landing_file(
        entry.id,
        status="loaded",
        records_received=received,
        records_loaded=received - bad,
        records_quarantined=bad,
        finished_at=datetime.now(UTC),
    )
    report.files_loaded += 1
    report.records_received += received
    report.records_loaded += received - bad
    report.records_quarantined += bad
    logger.info("loaded %s: %d record(s), %d quarantined", path, received, bad)


def split_records(
    parsed: DataFrame, schema: T.StructType, required: tuple[str, ...]
) -> tuple[DataFrame, DataFrame]:
    """Split parsed rows into valid rows and (record, reason) rows for quarantine."""
    columns = schema.fieldNames()
    corrupt = F.col(CORRUPT).isNotNull()
    missing = [F.when(F.col(c).isNull(), F.lit(c)) for c in required]
    missing_list = F.concat_ws(", ", *missing) if missing else F.lit("")
    reason = (
        F.when(corrupt, F.lit("malformed: does not parse against the declared schema"))
        .when(missing_list != "", F.concat(F.lit("null in required column(s): "), missing_list))
        .otherwise(F.lit(None))
    )
    tagged = parsed.withColumn("reason", reason)
    valid = tagged.where(F.col("reason").isNull()).select(*columns)
    malformed = tagged.where(F.col("reason").isNotNull()).select(
        F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*columns))).alias("record"), "reason"
    )
    return valid, malformed


def _parse(spark: SparkSession, source: StreamSource, path: Path) -> DataFrame:
    with_corrupt = T.StructType(
        [*source.schema.fields, T.StructField(CORRUPT, T.StringType(), True)]
    )
    if source.format == "json":
        _check_json_keys(spark, source, path)
        return (
            spark.read.schema(with_corrupt)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .json(str(path))
        )
    if source.format == "csv":
        _check_csv_header(source, path)
        return (
            spark.read.schema(with_corrupt)
            .option("header", source.csv_header)
            .option("sep", source.csv_delimiter)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .csv(str(path))
        )
    _check_parquet_schema(source, path)
    return (
        spark.read.schema(source.schema)
        .parquet(str(path))
        .withColumn(CORRUPT, F.lit(None).cast(T.StringType()))
    )


def _drift(
    source: StreamSource, path: Path, found: list[str], detail: str = ""
) -> SchemaDriftError:
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


def _check_json_keys(spark: SparkSession, source: StreamSource, path: Path) -> None:
    keys = [
        row[0]
        for row in spark.read.text(str(path))
        .select(F.explode(F.json_object_keys("value")).alias("key"))
        .distinct()
        .collect()
    ]
    expected = set(source.schema.fieldNames())
    unexpected = [k for k in keys if k not in expected]
    absent_required = [c for c in source.required if keys and c not in keys]
    if unexpected or absent_required:
        raise _drift(source, path, sorted(keys))


def _check_csv_header(source: StreamSource, path: Path) -> None:
    if not source.csv_header:
        return
    with path.open(newline="") as handle:
        header = next(csv.reader(handle, delimiter=source.csv_delimiter), [])
    if [h.strip() for h in header] != source.schema.fieldNames():
        raise _drift(source, path, [h.strip() for h in header])


def _check_parquet_schema(source: StreamSource, path: Path) -> None:
    found = arrow_to_spark(pq.read_schema(path))
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
