"""The pipeline state store: small control data in any SQLAlchemy database.

It holds the run ledger, the landing-file ledger, stage offsets (last consumed version of
each input table), the join operators' controller state, per-run metrics and the Delta
versions that in-flight work still pins. Bulk operator state (cache rows, pending tuples)
lives in Delta tables under the warehouse root, never here.

SQLite is the embedded default; a deployment passes a Postgres URL. The schema is created
or migrated on first use; ``SCHEMA_VERSION`` and ``_MIGRATIONS`` record how.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from common.errors import StateStoreError

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


def utcnow() -> datetime:
    return datetime.now(UTC)


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
    size_bytes: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default="registered")
    run_id: Mapped[str | None] = mapped_column(String(200), ForeignKey("runs.run_id"))
    batch_seq: Mapped[int | None] = mapped_column(Integer)
    records_received: Mapped[int | None] = mapped_column(Integer)
    records_loaded: Mapped[int | None] = mapped_column(Integer)
    records_quarantined: Mapped[int | None] = mapped_column(Integer)
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


# Each entry upgrades the schema from (key - 1) to key. create_all covers fresh databases.
_MIGRATIONS: Mapping[int, Sequence[str]] = {}


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
        self.url = url
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        try:
            self._engine: Engine = create_engine(url, future=True)
        except (SQLAlchemyError, ValueError) as e:
            raise StateStoreError(f"state store URL {url!r} is not usable: {e}") from e
        if url.startswith("sqlite"):
            event.listen(self._engine, "connect", _sqlite_pragmas)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        self._migrate()

    def _migrate(self) -> None:
        try:
            Base.metadata.create_all(self._engine)
            with self._session() as session:
                current = session.scalar(select(func.max(SchemaVersion.version)))
                if current is None:
                    session.add(SchemaVersion(version=SCHEMA_VERSION))
                    return
                if current > SCHEMA_VERSION:
                    raise StateStoreError(
                        f"state store {self.url} has schema version {current}, newer than this "
                        f"code's {SCHEMA_VERSION}; upgrade the pipeline package"
                    )
                for version in range(current + 1, SCHEMA_VERSION + 1):
                    for statement in _MIGRATIONS.get(version, ()):
                        session.execute(text(statement))
                    session.add(SchemaVersion(version=version))
                    logger.info("state store migrated to schema version %d", version)
        except SQLAlchemyError as e:
            raise StateStoreError(f"cannot open state store {self.url}: {e}") from e

    @contextmanager
    def _session(self) -> Iterator[Session]:
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as e:
            session.rollback()
            raise StateStoreError(f"state store {self.url}: {e}") from e
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
        self, stream: str, path: str, size_bytes: int, sha256: str, run_id: str
    ) -> LandingFile:
        with self._session() as session:
            row = LandingFile(
                stream=stream, path=path, size_bytes=size_bytes, sha256=sha256, run_id=run_id
            )
            session.add(row)
            session.flush()
            return row

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
            row = session.get(StageOffset, stage)
            if row is None:
                return StageOffset(stage=stage, input_version=0, step_seq=0)
            return row

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
        self, stage: str, input_version: int, step_seq: int, state: Mapping[str, Any]
    ) -> None:
        """Record a finished operator step and its controller state in one transaction."""
        with self._session() as session:
            offset = session.get(StageOffset, stage)
            if offset is None:
                offset = StageOffset(stage=stage)
                session.add(offset)
            offset.input_version, offset.step_seq, offset.updated_at = (
                input_version,
                step_seq,
                utcnow(),
            )
            offset.planned_input_version = offset.planned_master_version = None
            payload = json.loads(json.dumps(state))
            row = session.get(OperatorState, stage)
            if row is None:
                session.add(OperatorState(stage=stage, state=payload))
            else:
                row.state, row.updated_at = payload, utcnow()

    def operator_state(self, stage: str) -> dict[str, Any] | None:
        with self._session() as session:
            row = session.get(OperatorState, stage)
            return None if row is None else json.loads(json.dumps(row.state))

    def save_operator_state(self, stage: str, state: Mapping[str, Any]) -> None:
        with self._session() as session:
            row = session.get(OperatorState, stage)
            payload = json.loads(json.dumps(state))
            if row is None:
                session.add(OperatorState(stage=stage, state=payload))
            else:
                row.state, row.updated_at = payload, utcnow()

    # ------------------------------------------------------------------ metrics

    def record_metrics(
        self, run_id: str, stage: str, step: int, values: Mapping[str, float]
    ) -> None:
        with self._session() as session:
            session.add_all(
                Metric(run_id=run_id, stage=stage, step=step, name=name, value=float(value))
                for name, value in values.items()
            )

    def metrics(self, run_id: str | None = None) -> list[Metric]:
        with self._session() as session:
            query = select(Metric).order_by(Metric.id)
            if run_id is not None:
                query = query.where(Metric.run_id == run_id)
            return list(session.scalars(query))

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


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    # WAL lets the Airflow scheduler read while a task writes; the timeout rides out locks.
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()
