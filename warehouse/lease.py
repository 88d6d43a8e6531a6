"""The pipeline lease: one writer at a time per pipeline, with a fencing token.

Every command that writes (ingest, stage, run, validate, drain, backfill, resolve, maintain)
holds the lease of its pipeline for as long as it runs. The lease is a row in the state
store: ``(name, owner, token, expires_at)``.

Invariants:

- **One holder.** A lease is granted by a compare-and-swap on ``token``, so two processes
  racing for it cannot both win: the loser's conditional update matches no row.
- **Fencing.** Each grant increments ``token``. The holder checks its token inside every
  state-store transaction (the check and the write commit together) and right before every
  Delta commit, so a writer that lost its lease (paused past its expiry, then resumed)
  fails instead of writing over the new holder's work.
- **Stale leases are taken over safely.** A lease whose holder stopped renewing is free once
  it expires; a lease whose holder is a process on this host that no longer exists (killed)
  is free at once. Taking it over increments the token, fencing the old holder out.
- **Heartbeat.** A background thread renews the lease every ``ttl / 3``; a renewal that
  finds another token marks the lease lost, and the next check raises.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import TracebackType

from sqlalchemy import BigInteger, String, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from common.errors import DuplicateRecordError, LeaseHeldError, LeaseLostError
from warehouse.state_store import StateStore
from warehouse.state_tables import Base, DateTime

logger = logging.getLogger(__name__)


class LeaseRow(Base):
    """The lease of one pipeline; ``owner`` is empty while nobody holds it."""

    __tablename__ = "pipeline_lease"
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    owner: Mapped[str] = mapped_column(String(500), default="")
    purpose: Mapped[str] = mapped_column(String(500), default="")
    token: Mapped[int] = mapped_column(BigInteger, default=0)
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


@dataclass(frozen=True)
class LeaseInfo:
    """A snapshot of the lease row."""

    name: str
    owner: str
    purpose: str
    token: int
    acquired_at: datetime
    expires_at: datetime

    @property
    def free(self) -> bool:
        return not self.owner


@dataclass(frozen=True)
class LeaseSettings:
    """How long a grant lasts without renewal, and how long to wait for a busy lease."""

    ttl_seconds: float = 60.0
    wait_seconds: float = 0.0
    poll_seconds: float = 1.0

    def __post_init__(self) -> None:
        if self.ttl_seconds <= 0:
            raise ValueError(f"lease ttl_seconds must be > 0, got {self.ttl_seconds}")
        if self.wait_seconds < 0:
            raise ValueError(f"lease wait_seconds must be >= 0, got {self.wait_seconds}")


def _process_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return None
    # Field 22 of /proc/<pid>/stat; fields[0] here is field 3 (after "pid (comm)").
    return fields[19] if len(fields) > 19 else None


def owner_identity() -> str:
    """``host:pid:start:nonce``: unique per process, and checkable for liveness on this host."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}:{_process_start(pid)}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str) -> bool:
    """True only when ``owner`` is a process of this host that no longer runs.

    A process on another host is never judged dead here: its lease is free when it expires.
    The start time guards against a recycled pid.
    """
    host, _, rest = owner.partition(":")
    pid_text, _, rest = rest.partition(":")
    started, _, _ = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    return _process_start(int(pid_text)) != started


class PipelineLease:
    """Holds the lease of one pipeline while a command runs; see the module docstring."""

    def __init__(
        self, store: StateStore, name: str, purpose: str, settings: LeaseSettings | None = None
    ) -> None:
        self.store = store
        self.name = name
        self.purpose = purpose
        self.settings = settings or LeaseSettings()
        self.owner = owner_identity()
        self.token: int | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        LeaseRow.__table__.create(store.engine, checkfirst=True)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ acquire / release

    def acquire(self) -> LeaseInfo:
        """Take the lease, waiting up to ``wait_seconds``; raise LeaseHeldError otherwise."""
        deadline = time.monotonic() + self.settings.wait_seconds
        announced = False
        while True:
            granted, info = self._try_acquire()
            if granted:
                self.token = info.token
                self.store.set_guard(self._guard)
                self._start_heartbeat()
                logger.info(
                    "lease %s acquired (token %d) for %s", self.name, info.token, self.purpose
                )
                return info
            if time.monotonic() >= deadline:
                raise LeaseHeldError(
                    f"pipeline {self.name!r} is busy: {info.purpose or 'a command'} holds its "
                    f"lease (owner {info.owner}, since {info.acquired_at:%Y-%m-%d %H:%M:%S} "
                    f"UTC, expires {info.expires_at:%Y-%m-%d %H:%M:%S} UTC unless renewed); "
                    f"waited {self.settings.wait_seconds:.0f}s. Retry when it finishes, or "
                    "pass --wait SECONDS. A lease of a killed process on this host is taken "
                    "over at once; one of another host when it expires."
                )
            if not announced:
                logger.info(
                    "lease %s is held by %s (%s); waiting up to %.0fs",
                    self.name,
                    info.owner,
                    info.purpose,
                    self.settings.wait_seconds,
                )
                announced = True
            time.sleep(self.settings.poll_seconds)

    def release(self) -> None:
        """Give the lease back; safe to call twice and after the lease was lost."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        self.store.set_guard(None)
        if self.token is None:
            return
        with self.store.transaction() as session:
            session.execute(
                update(LeaseRow)
                .where(LeaseRow.name == self.name, LeaseRow.token == self.token)
                .values(owner="", purpose="", expires_at=datetime.now(UTC))
            )
        logger.info("lease %s released (token %d)", self.name, self.token)
        self.token = None

    def __enter__(self) -> PipelineLease:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    # ------------------------------------------------------------------ fencing

    def check(self) -> None:
        """Raise LeaseLostError unless this process still holds the lease (a commit guard)."""
        if self.token is None:
            raise LeaseLostError(f"lease {self.name!r} is not held by this process")
        if self._lost:
            raise LeaseLostError(self._lost)
        with self.store.transaction(guarded=False) as session:
            self._verify(session)

    def _guard(self, session: Session) -> None:
        self._verify(session)

    def _verify(self, session: Session) -> None:
        query = select(LeaseRow.token, LeaseRow.owner).where(LeaseRow.name == self.name)
        if session.get_bind().dialect.name == "postgresql":
            # A takeover's UPDATE waits for this transaction, so the write commits first.
            query = query.with_for_update(read=True)
        row = session.execute(query).first()
        if row is None or row.token != self.token or row.owner != self.owner:
            found = "no lease" if row is None else f"token {row.token} held by {row.owner}"
            self._lost = (
                f"lease {self.name!r} was lost: this process held token {self.token}, the "
                f"store now has {found}. Another run took over; this one stops writing."
            )
            raise LeaseLostError(self._lost)

    # ------------------------------------------------------------------ internals

    def _try_acquire(self) -> tuple[bool, LeaseInfo]:
        now = datetime.now(UTC)
        expires = now + timedelta(seconds=self.settings.ttl_seconds)
        try:
            with self.store.transaction(guarded=False) as session:
                row = session.get(LeaseRow, self.name)
                if row is None:
                    row = LeaseRow(
                        name=self.name,
                        owner=self.owner,
                        purpose=self.purpose,
                        token=1,
                        acquired_at=now,
                        expires_at=expires,
                    )
                    session.add(row)
                    session.flush()
                    return True, _info(row)
                current = _info(row)
                stale = current.free or current.expires_at <= now or owner_is_dead(current.owner)
                if not stale:
                    return False, current
                if not current.free:
                    logger.warning(
                        "lease %s: taking over from %s (%s), which %s",
                        self.name,
                        current.owner,
                        current.purpose,
                        "expired" if current.expires_at <= now else "is no longer running",
                    )
                swapped = session.execute(
                    update(LeaseRow)
                    .where(LeaseRow.name == self.name, LeaseRow.token == current.token)
                    .values(
                        owner=self.owner,
                        purpose=self.purpose,
                        token=current.token + 1,
                        acquired_at=now,
                        expires_at=expires,
                    )
                )
                if swapped.rowcount != 1:  # type: ignore[attr-defined]
                    return False, current
                return True, LeaseInfo(
                    self.name, self.owner, self.purpose, current.token + 1, now, expires
                )
        except DuplicateRecordError:
            # Another process inserted the first lease row at the same moment: it won.
            return False, self._read()

    def _read(self) -> LeaseInfo:
        with self.store.transaction(guarded=False) as session:
            row = session.get(LeaseRow, self.name)
            assert row is not None
            return _info(row)

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._heartbeat = threading.Thread(
            target=self._renew_loop, name=f"lease-{self.name}", daemon=True
        )
        self._heartbeat.start()

    def _renew_loop(self) -> None:
        interval = self.settings.ttl_seconds / 3
        while not self._stop.wait(interval):
            try:
                self._renew()
            except LeaseLostError as e:
                logger.error("%s", e)
                return
            except Exception as e:  # noqa: BLE001 - a flaky store must not kill the heartbeat
                logger.warning("lease %s: renewal failed, retrying: %s", self.name, e)

    def _renew(self) -> None:
        expires = datetime.now(UTC) + timedelta(seconds=self.settings.ttl_seconds)
        with self.store.transaction(guarded=False) as session:
            renewed = session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == self.name,
                    LeaseRow.token == self.token,
                    LeaseRow.owner == self.owner,
                )
                .values(expires_at=expires)
            )
            if renewed.rowcount != 1:  # type: ignore[attr-defined]
                self._lost = (
                    f"lease {self.name!r} (token {self.token}) was taken over by another run "
                    "while this one was still working; this run stops writing"
                )
                raise LeaseLostError(self._lost)


def _info(row: LeaseRow) -> LeaseInfo:
    return LeaseInfo(
        row.name,
        row.owner,
        row.purpose,
        int(row.token),
        row.acquired_at,
        row.expires_at,
    )
