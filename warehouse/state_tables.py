"""The state store's tables: the SQLAlchemy models of its control data.

One model per table (runs, landing files, stage offsets, operator state, metrics, version
pins, interval completeness, the schema version) on one declarative ``Base``, so that one
``create_all`` makes them all, and the timestamp type every backend reads back as aware UTC.
Kept apart from the store's methods, which read and write these rows by concern.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy import DateTime as SQLDateTime
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# The landing ledger's file statuses (``landing_files.status``).
REGISTERED, LOADED, REJECTED, DUPLICATE, MISSING = (
    "registered",
    "loaded",
    "rejected",
    "duplicate",
    "missing",
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class DateTime(TypeDecorator[datetime]):
    """A timestamp column that stores and returns aware UTC datetimes on every backend.

    SQLAlchemy's own ``DateTime(timezone=True)`` returns aware values in the session's time
    zone on PostgreSQL but naive ones on SQLite, which also drops the offset of an aware
    value it stores (02:00+02:00 would read back as 02:00). This type converts to UTC before
    storing and marks what it reads as UTC; a naive datetime is taken as UTC. The models
    below use it under SQLAlchemy's name, so ``DateTime(timezone=True)`` means this type.
    """

    impl = SQLDateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return _as_utc(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return _as_utc(value)


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    applied_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Run(Base):
    """One invocation of pipeline work: a scheduled interval, a backfill, a drain."""

    __tablename__ = "runs"
    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    interval_start: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    interval_end: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), default="running")
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[str | None] = mapped_column(Text)


class LandingFile(Base):
    """A landing-zone file, registered once by (stream, path) with its size and hash."""

    __tablename__ = "landing_files"
    __table_args__ = (UniqueConstraint("stream", "path"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    stream: Mapped[str] = mapped_column(String(200))
    path: Mapped[str] = mapped_column(String(2000))
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # files of 2 GiB and more
    sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=REGISTERED)
    # The run id itself, while the ledger's rows are "<run id>/<command>": no foreign key.
    run_id: Mapped[str | None] = mapped_column(String(200))
    batch_seq: Mapped[int | None] = mapped_column(Integer)
    records_received: Mapped[int | None] = mapped_column(Integer)
    records_loaded: Mapped[int | None] = mapped_column(Integer)
    records_quarantined: Mapped[int | None] = mapped_column(Integer)
    # Records an earlier file had loaded under the same id and content (version 2).
    records_resent: Mapped[int | None] = mapped_column(Integer)
    # An object-store file's ETag, as the GET whose bytes were hashed answered it: a listing
    # that shows this ETag and size at the path is the same content, not read again
    # (warehouse.landing). None for a local file, a file never read, and rows of version 2.
    etag: Mapped[str | None] = mapped_column(String)
    error: Mapped[str | None] = mapped_column(Text)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class StageOffset(Base):
    """How far a stage has consumed its input table, and its commit sequence."""

    __tablename__ = "stage_offsets"
    stage: Mapped[str] = mapped_column(String(200), primary_key=True)
    input_version: Mapped[int] = mapped_column(Integer, default=0)
    step_seq: Mapped[int] = mapped_column(Integer, default=0)
    # The step being executed: its input range end and master version are fixed before any
    # write, so a rerun after a crash repeats exactly the same step.
    planned_input_version: Mapped[int | None] = mapped_column(Integer)
    planned_master_version: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class OperatorState(Base):
    """The controller state of a join operator (small JSON: counters, cycle position)."""

    __tablename__ = "operator_state"
    stage: Mapped[str] = mapped_column(String(200), primary_key=True)
    state: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Metric(Base):
    """One measured value of one step of one stage in one run."""

    __tablename__ = "run_metrics"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(200), index=True)
    stage: Mapped[str] = mapped_column(String(200))
    step: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str] = mapped_column(String(100))
    value: Mapped[float] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class VersionPin(Base):
    """A Delta table version that some in-flight work still reads; vacuum keeps its files."""

    __tablename__ = "version_pins"
    __table_args__ = (UniqueConstraint("table_path", "version", "holder"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    table_path: Mapped[str] = mapped_column(String(2000))
    version: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str] = mapped_column(String(200))


class IntervalCompleteness(Base):
    """One event-time interval of one output table: its root-stream tuples, how many still
    wait in the table's chain, and since when and by which run it is complete
    (``pipeline.completeness``)."""

    __tablename__ = "interval_completeness"
    table_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    interval_start: Mapped[datetime] = mapped_column(DateTime(timezone=True), primary_key=True)
    interval_end: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    tuples: Mapped[int] = mapped_column(BigInteger)
    waiting: Mapped[int] = mapped_column(BigInteger)
    quarantined: Mapped[int] = mapped_column(BigInteger)
    oldest_waiting_entered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    complete: Mapped[bool] = mapped_column(Boolean)
    completed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    completed_run_id: Mapped[str | None] = mapped_column(String(200), index=True)
    run_id: Mapped[str] = mapped_column(String(200))  # the run that recorded these values
