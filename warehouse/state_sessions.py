"""The state store's connection and transactions, shared by its ledgers.

Opens the SQLAlchemy engine for a URL (SQLite or PostgreSQL), creates or migrates the
schema, and runs every call in one short transaction that may be fenced by the lease's
guard. Both backends behave the same: JSON state keeps non-finite floats, and a duplicate
key is a :class:`DuplicateRecordError` naming the conflicting row. Messages show the URL
with its password masked (:attr:`StoreSessions.safe_url`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from common.errors import DuplicateRecordError, StateStoreError
from common.secrets import mask_url, redact, register_url_password
from warehouse.state_schema import (
    SQLITE_BUSY_TIMEOUT_SECONDS,
    migrate,
    sqlite_file_lock,
    sqlite_pragmas,
)

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


class StoreSessions:
    """The store's engine and its short transactions; the ledgers build on it."""

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
            event.listen(self._engine, "connect", sqlite_pragmas)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)
        event.listen(self._sessions, "before_flush", _remember_flushed)
        self._guard: Callable[[Session], None] | None = None
        with sqlite_file_lock(self._engine):
            migrate(self._engine, self.safe_url)

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
