"""The pipeline state store: small control data in any SQLAlchemy database.

It holds the run ledger, the landing-file ledger, stage offsets (last consumed version of
each input table), the join operators' controller state, per-run metrics, the Delta
versions that in-flight work still pins and each output's completeness per event-time
interval. Bulk operator state (cache rows, pending tuples)
lives in Delta tables under the warehouse root, never here.

SQLite is the embedded default; a deployment passes a PostgreSQL URL
(``postgresql+psycopg://user:password@host/db``; psycopg is a dependency). Both backends
behave the same: timestamps are aware UTC datetimes, byte counts are 64-bit, JSON state keeps
non-finite floats, and a duplicate key is a :class:`DuplicateRecordError`. The schema is
created or migrated on first use, under a lock so that processes opening a fresh store
together do not collide (PostgreSQL: an advisory lock; SQLite: an ``flock`` on a ``.lock`` file
beside the database, held while the file is switched to WAL and the schema is created);
``SCHEMA_VERSION`` and ``_MIGRATIONS`` record how. Messages show
the URL with its password masked (:attr:`StateStore.safe_url`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    Integer,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy import DateTime as SQLDateTime
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from common.errors import DuplicateRecordError, StateStoreError
from common.secrets import mask_url, redact, register_url_password

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3
# pg_advisory_xact_lock key held while the schema is created or migrated ("enrich").
SCHEMA_LOCK_KEY = 0x656E72696368
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0


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


@dataclass(frozen=True)
class IntervalRecord:
    """A row of ``interval_completeness``, as the store reads and writes it.

    ``quarantined``: tuples answered into an output batch that was quarantined and is not
    resolved yet (not published). ``completed_at``/``completed_run_id``: when, and by
    which run, the interval last became complete (None while it is not); ``run_id``: the
    run that recorded these values.
    """

    table: str
    interval_start: datetime
    interval_end: datetime
    tuples: int
    waiting: int
    quarantined: int
    oldest_waiting_entered_at: datetime | None
    complete: bool
    completed_at: datetime | None
    completed_run_id: str | None
    run_id: str


class _StepStatements:
    """The statements a stage's every step runs, built once: a step completes every few
    tens of milliseconds, and building a statement (or the ORM's unit of work) each time
    cost more than running it (a completed step: 1.2 ms through the ORM, 0.47 ms so, on
    SQLite). Their parameters take the columns' types (the UTC timestamps, the JSON)."""

    def __init__(self) -> None:
        offsets = _table(StageOffset)
        states = _table(OperatorState)
        pins = _table(VersionPin)
        self.complete_offset = (
            update(offsets)
            .where(offsets.c.stage == bindparam("b_stage"))
            .values(
                input_version=bindparam("b_input_version"),
                step_seq=bindparam("b_step_seq"),
                updated_at=bindparam("b_at"),
                planned_input_version=None,
                planned_master_version=None,
            )
        )
        self.insert_offset = insert(offsets)
        self.update_state = (
            update(states)
            .where(states.c.stage == bindparam("b_stage"))
            .values(state=bindparam("b_state"), updated_at=bindparam("b_at"))
        )
        self.insert_state = insert(states)
        self.held_pins = select(pins.c.id, pins.c.table_path, pins.c.version).where(
            pins.c.holder == bindparam("b_holder")
        )
        self.delete_pin = delete(pins).where(pins.c.id == bindparam("b_id"))
        self.insert_pins = insert(pins)
        self.insert_metrics = insert(_table(Metric))


def _table(model: type[Base]) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


_STEP = _StepStatements()


# Each entry upgrades the schema from (key - 1) to key. create_all covers fresh databases,
# and adds a new table to an existing one (interval_completeness needed no entry).
_MIGRATIONS: Mapping[int, Sequence[str]] = {
    2: ("ALTER TABLE landing_files ADD COLUMN records_resent INTEGER",),
    3: ("ALTER TABLE landing_files ADD COLUMN etag VARCHAR",),
}


def _lock_schema(connection: Connection) -> None:
    """Serialize schema creation among processes opening the same store at once."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})
    elif connection.dialect.name == "sqlite":
        # pysqlite runs DDL outside transactions; an immediate one takes the write lock now.
        connection.exec_driver_sql("BEGIN IMMEDIATE")


# JSON: PostgreSQL refuses the NaN/Infinity tokens Python writes for non-finite floats, so
# they are stored as {"$float": "inf"} (and "-inf", "nan") on every backend. Rows written
# with the bare tokens by older code on SQLite still read back.
_FLOAT_TAG = "$float"
_NON_FINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _dump_json(value: Any) -> str:
    return json.dumps(_tag_non_finite(value), allow_nan=False)


def _load_json(text: str) -> Any:
    return json.loads(text, object_hook=_untag_non_finite)


def _tag_non_finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return {_FLOAT_TAG: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, Mapping):
        return {key: _tag_non_finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_tag_non_finite(item) for item in value]
    return value


def _untag_non_finite(obj: dict[str, Any]) -> Any:
    tag = obj.get(_FLOAT_TAG) if len(obj) == 1 else None
    return _NON_FINITE[tag] if isinstance(tag, str) and tag in _NON_FINITE else obj


# Duplicate keys: the rows a failed flush wrote, and the driver's account of the conflict.
_PG_UNIQUE_VIOLATION = "23505"
_SQLITE_UNIQUE = ("SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY")
_SQLITE_UNIQUE_TEXT = re.compile(r"UNIQUE constraint failed: (.+)$")
_PG_KEY_TEXT = re.compile(r"Key \((.+?)\)=")


def _remember_flushed(session: Session, _context: Any, _instances: Any) -> None:
    session.info["flushed"] = [*session.new, *session.dirty]


def _is_duplicate_key(error: IntegrityError) -> bool:
    orig = error.orig
    return (
        getattr(orig, "sqlstate", None) == _PG_UNIQUE_VIOLATION
        or getattr(orig, "sqlite_errorname", None) in _SQLITE_UNIQUE
        or _SQLITE_UNIQUE_TEXT.search(str(orig)) is not None
    )


def _describe_duplicate(error: IntegrityError, flushed: Sequence[object]) -> str:
    """``table: (col, ...) = (value, ...)`` of the rows that may hold the duplicate key."""
    table, columns = _conflict(error)
    rows = [row for row in flushed if getattr(row, "__tablename__", None) == table]
    if table is None or not columns or not rows:
        return f"{table or 'a table'} ({redact(str(error.orig)).strip()})"
    keys = [
        "(" + ", ".join(repr(getattr(row, column, None)) for column in columns) + ")"
        for row in rows
    ]
    return f"{table}: ({', '.join(columns)}) = {' or '.join(keys)}"


def _conflict(error: IntegrityError) -> tuple[str | None, list[str]]:
    """The table and key columns of a unique violation, as the driver reports them."""
    orig = error.orig
    diag = getattr(orig, "diag", None)
    if diag is not None:  # psycopg
        match = _PG_KEY_TEXT.search(diag.message_detail or "")
        columns = [c.strip() for c in match.group(1).split(",")] if match else []
        return diag.table_name, columns
    match = _SQLITE_UNIQUE_TEXT.search(str(orig))
    if match is None:
        return None, []
    qualified = [c.strip() for c in match.group(1).split(",")]
    return qualified[0].split(".")[0], [c.split(".", 1)[-1] for c in qualified]


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    kind: str
    status: str
    interval_start: datetime | None
    interval_end: datetime | None
    started_at: datetime
    finished_at: datetime | None
    error: str | None


class StateStore:
    """Typed access to the control tables; every method is one short transaction."""

    def __init__(self, url: str) -> None:
        self.url = url  # to connect with; messages and logs show ``safe_url``
        self.safe_url = mask_url(url)
        register_url_password(url)
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {
            "json_serializer": _dump_json,
            "json_deserializer": _load_json,
        }
        if url.startswith("sqlite"):
            options["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_SECONDS}
        try:
            self._engine: Engine = create_engine(url, **options)
        except ImportError as e:
            raise StateStoreError(
                f"state store URL {self.safe_url} needs the database driver "
                f"{e.name or 'of its dialect'!r}, which is not installed ({redact(str(e))}); "
                "PostgreSQL URLs work with the bundled "
                "psycopg driver: postgresql+psycopg://user:password@host:port/database"
            ) from e
        except (SQLAlchemyError, ValueError) as e:
            raise StateStoreError(
                f"state store URL {self.safe_url} is not usable: {redact(str(e))}; expected "
                "a SQLAlchemy URL such as sqlite:///path/to/store.db or "
                "postgresql+psycopg://user:password@host:port/database"
            ) from e
        if url.startswith("sqlite"):
            event.listen(self._engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        event.listen(self._sessions, "before_flush", _remember_flushed)
        self._guard: Callable[[Session], None] | None = None
        with _sqlite_file_lock(self._engine):
            self._migrate()

    def _migrate(self) -> None:
        """Create or upgrade the schema in one transaction that holds the schema lock."""
        try:
            with self._engine.connect() as connection:
                _use_wal(connection)
                _lock_schema(connection)
                Base.metadata.create_all(connection)
                current = connection.scalar(select(func.max(SchemaVersion.version)))
                if current is not None and current > SCHEMA_VERSION:
                    raise StateStoreError(
                        f"state store {self.safe_url} has schema version {current}, newer than "
                        f"this code's {SCHEMA_VERSION}; upgrade the pipeline package"
                    )
                if current is None:
                    connection.execute(insert(SchemaVersion).values(version=SCHEMA_VERSION))
                else:
                    for version in range(current + 1, SCHEMA_VERSION + 1):
                        for statement in _MIGRATIONS.get(version, ()):
                            connection.execute(text(statement))
                        connection.execute(insert(SchemaVersion).values(version=version))
                        logger.info("state store migrated to schema version %d", version)
                connection.commit()
        except SQLAlchemyError as e:
            raise StateStoreError(
                f"cannot open state store {self.safe_url}: {redact(str(e))}"
            ) from e

    @property
    def engine(self) -> Engine:
        return self._engine

    def set_guard(self, guard: Callable[[Session], None] | None) -> None:
        """Run ``guard`` at the start of every transaction (the lease's fencing check).

        The guard and the transaction's writes commit together, so a writer fenced out by
        another run's lease fails before any of its writes land.
        """
        self._guard = guard

    def transaction(self, guarded: bool = True) -> AbstractContextManager[Session]:
        """One short transaction; ``guarded=False`` skips the guard (the lease itself)."""
        return self._session(guarded)

    @contextmanager
    def _session(self, guarded: bool = True) -> Iterator[Session]:
        session = self._sessions()
        try:
            if guarded and self._guard is not None:
                self._guard(session)
            yield session
            session.commit()
        except IntegrityError as e:
            session.rollback()
            if _is_duplicate_key(e):
                raise DuplicateRecordError(
                    f"state store {self.safe_url}: duplicate key in "
                    f"{_describe_duplicate(e, session.info.get('flushed', []))} is already "
                    "recorded; expected a key not recorded yet"
                ) from e
            raise StateStoreError(f"state store {self.safe_url}: {redact(str(e))}") from e
        except SQLAlchemyError as e:
            session.rollback()
            raise StateStoreError(f"state store {self.safe_url}: {redact(str(e))}") from e
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def dispose(self) -> None:
        self._engine.dispose()

    # ------------------------------------------------------------------ run ledger

    def start_run(
        self,
        run_id: str,
        kind: str,
        interval_start: datetime | None = None,
        interval_end: datetime | None = None,
    ) -> None:
        """Record a run as running; a rerun of the same id counts as another attempt."""
        with self._session() as session:
            run = session.get(Run, run_id)
            if run is None:
                session.add(
                    Run(
                        run_id=run_id,
                        kind=kind,
                        interval_start=interval_start,
                        interval_end=interval_end,
                    )
                )
            else:
                run.attempts += 1
                run.status = "running"
                run.error = None
                run.finished_at = None

    def finish_run(self, run_id: str, error: str | None = None) -> None:
        with self._session() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise StateStoreError(f"finish_run: no run {run_id!r} was started")
            run.status = "failed" if error else "succeeded"
            run.error = error
            run.finished_at = utcnow()

    def runs(self, limit: int = 20, since: datetime | None = None) -> list[RunSummary]:
        with self._session() as session:
            query = select(Run).order_by(Run.started_at.desc()).limit(limit)
            if since is not None:
                query = query.where(Run.started_at >= since)
            return [
                RunSummary(
                    r.run_id,
                    r.kind,
                    r.status,
                    r.interval_start,
                    r.interval_end,
                    r.started_at,
                    r.finished_at,
                    r.error,
                )
                for r in session.scalars(query)
            ]

    # ------------------------------------------------------------------ landing files

    def landing_file(self, stream: str, path: str) -> LandingFile | None:
        with self._session() as session:
            return session.scalar(
                select(LandingFile).where(LandingFile.stream == stream, LandingFile.path == path)
            )

    def register_landing_file(
        self,
        stream: str,
        path: str,
        size_bytes: int,
        sha256: str,
        run_id: str,
        *,
        status: str = "registered",
        error: str | None = None,
        etag: str | None = None,
    ) -> LandingFile:
        """Add a file to the ledger; a file that is never to load is recorded final at once.
        ``etag``: an object's ETag, of the very bytes whose ``sha256`` this is."""
        with self._session() as session:
            row = _landing_row(stream, path, size_bytes, sha256, run_id, status, error, etag)
            session.add(row)
            session.flush()
            return row

    def reregister_landing_file(
        self,
        file_id: int,
        size_bytes: int,
        sha256: str,
        run_id: str,
        *,
        status: str = "registered",
        error: str | None = None,
        etag: str | None = None,
    ) -> LandingFile:
        """Replace a never-loaded ledger row by a new row for the file's new content (and
        ``etag``, as :meth:`register_landing_file`).

        The new row gets a fresh id, greater than every id used so far: ingestion commits
        under the id as a Delta app-transaction version, and Delta skips a version at or
        below the last one it recorded. The old row's path is moved aside before the insert
        (the (stream, path) key must stay unique) so that SQLite, which numbers a new row
        max(id) + 1, cannot hand the old id out again; then the old row is deleted. All in
        one transaction, so the moved-aside path is never seen.
        """
        with self._session() as session:
            old = session.get(LandingFile, file_id)
            if old is None:
                raise StateStoreError(f"no landing file with id {file_id}")
            stream, path = old.stream, old.path
            old.path = f"{path} (ledger id {old.id}, being replaced)"
            session.flush()
            row = _landing_row(stream, path, size_bytes, sha256, run_id, status, error, etag)
            session.add(row)
            session.flush()
            session.delete(old)
            session.flush()
            return row

    def landing_file_with_digest(
        self, stream: str, sha256: str, statuses: Sequence[str]
    ) -> LandingFile | None:
        """The earliest file of ``stream`` with this SHA-256 whose status is in ``statuses``."""
        with self._session() as session:
            return session.scalar(
                select(LandingFile)
                .where(
                    LandingFile.stream == stream,
                    LandingFile.sha256 == sha256,
                    LandingFile.status.in_(list(statuses)),
                )
                .order_by(LandingFile.id)
                .limit(1)
            )

    def update_landing_file(self, file_id: int, **fields: Any) -> None:
        with self._session() as session:
            row = session.get(LandingFile, file_id)
            if row is None:
                raise StateStoreError(f"no landing file with id {file_id}")
            for key, value in fields.items():
                setattr(row, key, value)

    def landing_files(self, stream: str, status: str | None = None) -> list[LandingFile]:
        with self._session() as session:
            query = select(LandingFile).where(LandingFile.stream == stream)
            if status is not None:
                query = query.where(LandingFile.status == status)
            return list(session.scalars(query.order_by(LandingFile.id)))

    # ------------------------------------------------------------------ offsets and state

    def offset(self, stage: str) -> StageOffset:
        with self._session() as session:
            return _offset_in(session, stage)

    def set_offset(self, stage: str, input_version: int, step_seq: int) -> None:
        """Record a completed step: the input is consumed up to ``input_version``."""
        with self._session() as session:
            row = session.get(StageOffset, stage)
            if row is None:
                row = StageOffset(stage=stage)
                session.add(row)
            row.input_version, row.step_seq, row.updated_at = input_version, step_seq, utcnow()
            row.planned_input_version = row.planned_master_version = None

    def plan_step(self, stage: str, input_version: int, master_version: int | None) -> StageOffset:
        """Fix the next step's input range and master version, unless one is already planned."""
        with self._session() as session:
            row = session.get(StageOffset, stage)
            if row is None:
                row = StageOffset(stage=stage, input_version=0, step_seq=0)
                session.add(row)
            if row.planned_input_version is None:
                row.planned_input_version = input_version
                row.planned_master_version = master_version
                row.updated_at = utcnow()
            session.flush()
            return row

    def complete_step(
        self,
        stage: str,
        input_version: int,
        step_seq: int,
        state: Mapping[str, Any],
        pins: tuple[str, Mapping[str, Sequence[int]]] | None = None,
        metrics: StepMetricValues | None = None,
    ) -> None:
        """Record a finished operator step and its controller state in one transaction;
        with ``pins`` (holder, table path -> versions), make those the holder's pins in
        the same transaction (:meth:`set_pins`); with ``metrics``, record the step's
        metrics in it too (:meth:`record_metrics`): a step is never completed without
        them, nor they recorded for a step that was not."""
        pinned = None if pins is None else (pins[0], _wanted_pins(*pins))
        now = utcnow()
        with self._session() as session:
            if metrics is not None and metrics.values:
                session.execute(
                    _STEP.insert_metrics,
                    _metric_rows(metrics.run_id, stage, metrics.step, metrics.values, now),
                )
            found = session.execute(
                _STEP.complete_offset,
                {
                    "b_stage": stage,
                    "b_input_version": input_version,
                    "b_step_seq": step_seq,
                    "b_at": now,
                },
            )
            if not _matched(found):
                session.execute(
                    _STEP.insert_offset,
                    {
                        "stage": stage,
                        "input_version": input_version,
                        "step_seq": step_seq,
                        "updated_at": now,
                    },
                )
            _put_operator_state(session, stage, state)
            if pinned is not None:
                _replace_pins(session, *pinned)

    def operator_state(self, stage: str) -> dict[str, Any] | None:
        with self._session() as session:
            return _operator_state_in(session, stage)

    def stage_progress(self, stage: str) -> tuple[StageOffset, dict[str, Any] | None]:
        """:meth:`offset` and :meth:`operator_state` of ``stage`` in one transaction, as a
        step starts from them."""
        with self._session() as session:
            return _offset_in(session, stage), _operator_state_in(session, stage)

    def save_operator_state(
        self,
        stage: str,
        state: Mapping[str, Any],
        pins: tuple[str, Mapping[str, Sequence[int]]] | None = None,
    ) -> None:
        """Save ``stage``'s controller state; with ``pins`` (holder, table path ->
        versions), first make those the holder's pins, in the same transaction (a plan is
        saved with the pins that keep what it reads)."""
        pinned = None if pins is None else (pins[0], _wanted_pins(*pins))
        with self._session() as session:
            if pinned is not None:
                _replace_pins(session, *pinned)
            _put_operator_state(session, stage, state)

    # ------------------------------------------------------------------ metrics

    def record_metrics(
        self, run_id: str, stage: str, step: int, values: Mapping[str, float]
    ) -> None:
        if not values:
            return
        with self._session() as session:
            session.execute(
                _STEP.insert_metrics, _metric_rows(run_id, stage, step, values, utcnow())
            )

    def metrics(self, run_id: str | None = None) -> list[Metric]:
        with self._session() as session:
            query = select(Metric).order_by(Metric.id)
            if run_id is not None:
                query = query.where(Metric.run_id == run_id)
            return list(session.scalars(query))

    # ------------------------------------------------------------------ completeness

    def save_completeness(
        self,
        records: Sequence[IntervalRecord],
        state: tuple[str, Mapping[str, Any]],
        pins: tuple[str, Mapping[str, Sequence[int]]],
    ) -> None:
        """Write ``records`` (one row per table and interval, replacing any there), the
        computation's progress ``state`` (key, controller state) and its ``pins`` (holder,
        table path -> versions), in one transaction."""
        pinned = (pins[0], _wanted_pins(*pins))
        with self._session() as session:
            for record in records:
                row = session.get(IntervalCompleteness, (record.table, record.interval_start))
                if row is None:
                    row = IntervalCompleteness(
                        table_name=record.table, interval_start=record.interval_start
                    )
                    session.add(row)
                for name in _RECORD_FIELDS:
                    setattr(row, name, getattr(record, name))
            _put_operator_state(session, *state)
            _replace_pins(session, *pinned)

    def interval_records(
        self,
        table: str,
        *,
        latest: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        incomplete: bool = False,
        starts: Sequence[datetime] = (),
    ) -> list[IntervalRecord]:
        """``table``'s interval rows, newest interval first: the ``latest`` ones, those
        starting in ``[since, until)``, only the incomplete ones (``incomplete``), or,
        with ``starts``, the incomplete ones and those starting at one of ``starts``."""
        rows = IntervalCompleteness
        query = select(rows).where(rows.table_name == table)
        if since is not None:
            query = query.where(rows.interval_start >= since)
        if until is not None:
            query = query.where(rows.interval_start < until)
        if starts:
            query = query.where(~rows.complete | rows.interval_start.in_(list(starts)))
        elif incomplete:
            query = query.where(~rows.complete)
        query = query.order_by(rows.interval_start.desc())
        if latest is not None:
            query = query.limit(latest)
        with self._session() as session:
            return [_interval_record(row) for row in session.scalars(query)]

    def intervals_completed_by(self, run_id: str, table: str) -> list[IntervalRecord]:
        """The intervals of ``table`` that run ``run_id`` completed, oldest first."""
        rows = IntervalCompleteness
        query = (
            select(rows)
            .where(rows.table_name == table, rows.completed_run_id == run_id, rows.complete)
            .order_by(rows.interval_start)
        )
        with self._session() as session:
            return [_interval_record(row) for row in session.scalars(query)]

    # ------------------------------------------------------------------ version pins

    def pin(self, table_path: str, version: int, holder: str) -> None:
        with self._session() as session:
            exists = session.scalar(
                select(VersionPin).where(
                    VersionPin.table_path == table_path,
                    VersionPin.version == version,
                    VersionPin.holder == holder,
                )
            )
            if exists is None:
                session.add(VersionPin(table_path=table_path, version=version, holder=holder))

    def unpin(self, table_path: str, holder: str, keep: Sequence[int] = ()) -> None:
        """Drop ``holder``'s pins on the table except the versions in ``keep``."""
        with self._session() as session:
            for row in session.scalars(
                select(VersionPin).where(
                    VersionPin.table_path == table_path, VersionPin.holder == holder
                )
            ):
                if row.version not in keep:
                    session.delete(row)

    def pinned_versions(self, table_path: str) -> list[int]:
        with self._session() as session:
            return sorted(
                set(
                    session.scalars(
                        select(VersionPin.version).where(VersionPin.table_path == table_path)
                    )
                )
            )

    def set_pins(self, holder: str, pins: Mapping[str, Sequence[int]]) -> None:
        """Make ``pins`` (table path -> versions) all of ``holder``'s pins, in one transaction.

        Pins of the holder on versions or tables ``pins`` does not name are dropped; an empty
        mapping releases everything the holder pinned.
        """
        wanted = _wanted_pins(holder, pins)
        with self._session() as session:
            _replace_pins(session, holder, wanted)

    def pins_of(self, holder: str) -> dict[str, list[int]]:
        """The versions ``holder`` pins, by table path."""
        with self._session() as session:
            pins: dict[str, list[int]] = {}
            for row in session.scalars(
                select(VersionPin)
                .where(VersionPin.holder == holder)
                .order_by(VersionPin.table_path, VersionPin.version)
            ):
                pins.setdefault(row.table_path, []).append(row.version)
            return pins


def _landing_row(
    stream: str,
    path: str,
    size_bytes: int,
    sha256: str,
    run_id: str,
    status: str,
    error: str | None,
    etag: str | None = None,
) -> LandingFile:
    """A new ledger row; a file that is never to load is recorded as finished at once."""
    return LandingFile(
        stream=stream,
        path=path,
        size_bytes=size_bytes,
        sha256=sha256,
        etag=etag,
        run_id=run_id,
        status=status,
        error=error,
        finished_at=None if status == "registered" else utcnow(),
    )


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # Per connection: the timeout rides out another writer's lock. The journal mode is a
    # property of the file, set once by ``_use_wal``.
    cursor = connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
    cursor.close()


def _use_wal(connection: Connection) -> None:
    """Switch a SQLite database file to WAL, so the Airflow scheduler reads while a task writes.

    Switching needs the file's exclusive lock and SQLite answers "database is locked" at once,
    without its busy handler, when another connection switches at the same moment; so it runs
    only inside :func:`_sqlite_file_lock`, and only while the file is not in WAL already (the
    mode persists in the file, so later opens skip it).
    """
    if connection.dialect.name != "sqlite":
        return
    mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
    if str(mode).lower() not in ("wal", "memory"):
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


@contextmanager
def _sqlite_file_lock(engine: Engine) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<database>.lock`` (SQLite files only; else a no-op).

    It serialises the first opens of one database file across processes and threads on this
    host, which is where a SQLite file can be shared.
    """
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    lock_path = Path(database).with_name(Path(database).name + ".lock")
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def rejected_files_in_place(store: StateStore, stream: str) -> list[LandingFile]:
    """Rejected files of a stream that are still in its landing directory.

    Here, beside the ledger, so that ``enrich status`` answers without importing Spark.
    """
    return [row for row in store.landing_files(stream, REJECTED) if os.path.lexists(row.path)]


def _wanted_pins(holder: str, pins: Mapping[str, Sequence[int]]) -> set[tuple[str, int]]:
    """``pins`` as (table path, version) pairs; refused when a version is negative."""
    wanted = {(path, int(v)) for path, versions in pins.items() for v in versions}
    negative = sorted((p, v) for p, v in wanted if v < 0)
    if negative:
        raise StateStoreError(f"set_pins({holder!r}): Delta versions are >= 0, got {negative[:5]}")
    return wanted


def _replace_pins(session: Session, holder: str, wanted: set[tuple[str, int]]) -> None:
    """Within ``session``: make ``wanted`` all of ``holder``'s pins (those it keeps stay
    as they are)."""
    held = {
        (path, int(version)): pin_id
        for pin_id, path, version in session.execute(_STEP.held_pins, {"b_holder": holder})
    }
    gone = [{"b_id": pin_id} for key, pin_id in held.items() if key not in wanted]
    if gone:
        session.execute(_STEP.delete_pin, gone)
    added = sorted(wanted - held.keys())
    if added:
        session.execute(
            _STEP.insert_pins,
            [{"table_path": path, "version": version, "holder": holder} for path, version in added],
        )


@dataclass(frozen=True)
class StepMetricValues:
    """A step's metrics, recorded with its completion (``StateStore.complete_step``)."""

    run_id: str
    step: int
    values: Mapping[str, float]


def _metric_rows(
    run_id: str, stage: str, step: int, values: Mapping[str, float], now: datetime
) -> list[dict[str, Any]]:
    """The rows of one multi-row insert: a step records a few dozen values, and the ORM's
    unit of work costs more than the rows."""
    return [
        {
            "run_id": run_id,
            "stage": stage,
            "step": step,
            "name": name,
            "value": float(value),
            "recorded_at": now,
        }
        for name, value in values.items()
    ]


_RECORD_FIELDS = (
    "interval_end",
    "tuples",
    "waiting",
    "quarantined",
    "oldest_waiting_entered_at",
    "complete",
    "completed_at",
    "completed_run_id",
    "run_id",
)


def _interval_record(row: IntervalCompleteness) -> IntervalRecord:
    return IntervalRecord(
        row.table_name,
        row.interval_start,
        **{name: getattr(row, name) for name in _RECORD_FIELDS},
    )


def _offset_in(session: Session, stage: str) -> StageOffset:
    """Within ``session``: ``stage``'s offset, or a new stage's (nothing consumed)."""
    row = session.get(StageOffset, stage)
    if row is None:
        return StageOffset(stage=stage, input_version=0, step_seq=0)
    return row


def _operator_state_in(session: Session, stage: str) -> dict[str, Any] | None:
    """Within ``session``: a copy of ``stage``'s controller state, or None."""
    row = session.get(OperatorState, stage)
    return None if row is None else json.loads(json.dumps(row.state))


def _put_operator_state(session: Session, stage: str, state: Mapping[str, Any]) -> None:
    """Within ``session``: ``stage``'s controller state becomes ``state``."""
    payload = json.loads(json.dumps(state))
    now = utcnow()
    found = session.execute(_STEP.update_state, {"b_stage": stage, "b_state": payload, "b_at": now})
    if not _matched(found):
        session.execute(_STEP.insert_state, {"stage": stage, "state": payload, "updated_at": now})


def _matched(result: Any) -> bool:
    """Whether an UPDATE found its row (``rowcount``: the rows it matched)."""
    return bool(result.rowcount)
