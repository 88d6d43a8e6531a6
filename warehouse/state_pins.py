"""Version pins: the Delta table versions in-flight work still reads.

A holder (a stage's planned step, a completeness computation) pins the versions it reads;
vacuum keeps their files. The helpers here also serve the ledgers that save pins in the
same transaction as their own rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from common.errors import StateStoreError
from warehouse.state_sessions import StoreSessions
from warehouse.state_statements import STEP
from warehouse.state_tables import VersionPin


class VersionPins(StoreSessions):
    """The store's ``version_pins`` table."""

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
        wanted = wanted_pins(holder, pins)
        with self._session() as session:
            replace_pins(session, holder, wanted)

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


def wanted_pins(holder: str, pins: Mapping[str, Sequence[int]]) -> set[tuple[str, int]]:
    """``pins`` as (table path, version) pairs; refused when a version is negative."""
    wanted = {(path, int(v)) for path, versions in pins.items() for v in versions}
    negative = sorted((p, v) for p, v in wanted if v < 0)
    if negative:
        raise StateStoreError(f"set_pins({holder!r}): Delta versions are >= 0, got {negative[:5]}")
    return wanted


def replace_pins(session: Session, holder: str, wanted: set[tuple[str, int]]) -> None:
    """Within ``session``: make ``wanted`` all of ``holder``'s pins (those it keeps stay
    as they are)."""
    held = {
        (path, int(version)): pin_id
        for pin_id, path, version in session.execute(STEP.held_pins, {"b_holder": holder})
    }
    gone = [{"b_id": pin_id} for key, pin_id in held.items() if key not in wanted]
    if gone:
        session.execute(STEP.delete_pin, gone)
    added = sorted(wanted - held.keys())
    if added:
        session.execute(
            STEP.insert_pins,
            [{"table_path": path, "version": version, "holder": holder} for path, version in added],
        )
