"""The landing-file ledger: one row per landing-zone file, with its size and SHA-256.

Ingestion registers each file once by (stream, path), records what loading it gave, and
finds earlier files with the same content; a file whose content changed before it loaded
gets a new row with a fresh id (Delta skips app-transaction versions it has seen).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select

from common.errors import StateStoreError
from warehouse.state_sessions import StoreSessions
from warehouse.state_tables import REJECTED, LandingFile, utcnow

PATHS_PER_QUERY = 500
"""Paths in one ``IN`` list: well within SQLite's and PostgreSQL's limits on parameters."""


class LandingLedger(StoreSessions):
    """The store's ``landing_files`` table."""

    def landing_file(self, stream: str, path: str) -> LandingFile | None:
        with self._session() as session:
            return session.scalar(
                select(LandingFile).where(LandingFile.stream == stream, LandingFile.path == path)
            )

    def landing_files_at(self, stream: str, paths: Sequence[str]) -> dict[str, LandingFile]:
        """The ledger rows of ``paths`` (those it has), by path: one query per
        :data:`PATHS_PER_QUERY` paths, where asking path by path cost a round trip each
        (an ingest lists every file still in its landing zone, the loaded ones too)."""
        found: dict[str, LandingFile] = {}
        with self._session() as session:
            for start in range(0, len(paths), PATHS_PER_QUERY):
                chunk = list(paths[start : start + PATHS_PER_QUERY])
                rows = session.scalars(
                    select(LandingFile).where(
                        LandingFile.stream == stream, LandingFile.path.in_(chunk)
                    )
                )
                found.update((row.path, row) for row in rows)
        return found

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
        replaces: int | None = None,
    ) -> LandingFile:
        """Add a file to the ledger; a file that is never to load is recorded final at once.
        ``etag``: an object's ETag, of the very bytes whose ``sha256`` this is.

        ``replaces``: the id of the path's never-loaded row, replaced by this row for the
        file's new content. The new row gets a fresh id, greater than every id used so far:
        ingestion commits under the id as a Delta app-transaction version, and Delta skips a
        version at or below the last one it recorded. The old row's path is moved aside
        before the insert (the (stream, path) key must stay unique) so that SQLite, which
        numbers a new row max(id) + 1, cannot hand the old id out again; then the old row is
        deleted. All in one transaction, so the moved-aside path is never seen.
        """
        with self._session() as session:
            old = None if replaces is None else session.get(LandingFile, replaces)
            if replaces is not None:
                if old is None or (old.stream, old.path) != (stream, path):
                    raise StateStoreError(
                        f"no landing file with id {replaces} at {stream}:{path} to replace"
                    )
                old.path = f"{path} (ledger id {old.id}, being replaced)"
                session.flush()
            row = LandingFile(
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
            session.add(row)
            session.flush()
            if old is not None:
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


def rejected_files_in_place(store: LandingLedger, stream: str) -> list[LandingFile]:
    """Rejected files of a stream that are still in its landing directory.

    Here, beside the ledger, so that ``enrich status`` answers without importing Spark.
    """
    return [row for row in store.landing_files(stream, REJECTED) if os.path.lexists(row.path)]
