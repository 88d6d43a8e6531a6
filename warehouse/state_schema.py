"""Creating and migrating the state store's schema, safely among processes.

The schema is created or upgraded on first use under a lock (PostgreSQL: an advisory lock;
SQLite: an ``flock`` on a ``.lock`` file beside the database, held while the file is
switched to WAL and the schema is created), so processes opening a fresh store together do
not collide. ``SCHEMA_VERSION`` and ``_MIGRATIONS`` record how each version upgrades.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from common.errors import StateStoreError
from common.secrets import redact
from warehouse.state_tables import Base, SchemaVersion

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3
# pg_advisory_xact_lock key held while the schema is created or migrated ("enrich").
SCHEMA_LOCK_KEY = 0x656E72696368
SQLITE_BUSY_TIMEOUT_SECONDS = 30.0

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


def migrate(engine: Engine, safe_url: str) -> None:
    """Create or upgrade the schema in one transaction that holds the schema lock."""
    try:
        with engine.connect() as connection:
            _use_wal(connection)
            _lock_schema(connection)
            Base.metadata.create_all(connection)
            current = connection.scalar(select(func.max(SchemaVersion.version)))
            if current is not None and current > SCHEMA_VERSION:
                raise StateStoreError(
                    f"state store {safe_url} has schema version {current}, newer than "
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
        raise StateStoreError(f"cannot open state store {safe_url}: {redact(str(e))}") from e


def sqlite_pragmas(connection: Any, _record: Any) -> None:
    # Per connection: the timeout rides out another writer's lock. The journal mode is a
    # property of the file, set once by ``_use_wal``.
    cursor = connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_SECONDS * 1000)}")
    cursor.close()


def _use_wal(connection: Connection) -> None:
    """Switch a SQLite database file to WAL, so the Airflow scheduler reads while a task writes.

    Switching needs the file's exclusive lock and SQLite answers "database is locked" at once,
    without its busy handler, when another connection switches at the same moment; so it runs
    only inside :func:`sqlite_file_lock`, and only while the file is not in WAL already (the
    mode persists in the file, so later opens skip it).
    """
    if connection.dialect.name != "sqlite":
        return
    mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
    if str(mode).lower() not in ("wal", "memory"):
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


@contextmanager
def sqlite_file_lock(engine: Engine) -> Iterator[None]:
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
