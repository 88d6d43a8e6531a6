"""A real, throwaway PostgreSQL server for the tests, on loopback.

``initdb`` into a temporary folder, ``pg_ctl start`` on a free port of 127.0.0.1 (and a
Unix socket in the same folder), password authentication over TCP, so that URLs carry a
password as a deployment's do. PostgreSQL refuses to run as root: as root, the server runs
as the ``postgres`` system user (created by Debian's ``postgresql`` package), which owns
the folder. The binaries come from Debian's ``postgresql`` package, which ``make test``
installs; without them the tests fail (never skip) and say so.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
SERVER_USER = "postgres"  # the OS user the server runs as when the tests run as root
SUPERUSER = "enrich_test"  # the database superuser the URLs name
START_ATTEMPTS = 3


def postgres_bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<ver>/bin`` with initdb and pg_ctl (or $PG_BIN)."""
    candidates = [Path(os.environ["PG_BIN"])] if os.environ.get("PG_BIN") else []
    candidates += sorted(
        Path("/").glob(PG_BIN_GLOB.lstrip("/")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    pytest.fail(
        f"PostgreSQL server binaries (initdb, pg_ctl) not found in {PG_BIN_GLOB} "
        f"(looked at: {[str(c) for c in candidates] or 'nothing'}); run `make test`, which "
        "installs Debian's postgresql package (or `make postgres-deps` for just that)",
        pytrace=False,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder; :meth:`start`, then :meth:`stop`."""

    def __init__(self) -> None:
        self.bin = postgres_bin_dir()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            try:
                pwd.getpwnam(SERVER_USER)
            except KeyError:
                pytest.fail(
                    f"running as root, but there is no {SERVER_USER!r} system user to run "
                    "PostgreSQL as (PostgreSQL refuses root); run `make test`, which installs "
                    "Debian's postgresql package and with it that user",
                    pytrace=False,
                )
        self.base = Path(tempfile.mkdtemp(prefix="enrich-pg-"))
        self.data, self.sockets, self.log = (
            self.base / "data",
            self.base / "sock",
            self.base / "server.log",
        )
        self.password = secrets.token_urlsafe(16)
        self.port = 0
        self.running = False

    def _run(self, argv: Sequence[str], what: str) -> None:
        prefix = ["runuser", "-u", SERVER_USER, "--"] if self.as_root else []
        done = subprocess.run(
            [*prefix, *argv],
            cwd=self.base,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "LC_ALL": "C", "PGTZ": "UTC"},
        )
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else "(no server log)"
            raise RuntimeError(
                f"{what} failed with exit code {done.returncode}: {' '.join(argv)}\n"
                f"stdout: {done.stdout}\nstderr: {done.stderr}\nserver log:\n{log[-3000:]}"
            )

    def start(self) -> None:
        self.sockets.mkdir()
        password_file = self.base / "pwfile"
        password_file.write_text(self.password + "\n")
        if self.as_root:
            server = pwd.getpwnam(SERVER_USER)
            for path in (self.base, self.sockets, password_file):
                os.chown(path, server.pw_uid, server.pw_gid)
        self.base.chmod(0o700)
        self._run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SUPERUSER,
                f"--pwfile={password_file}",
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            "initdb",
        )
        password_file.unlink()
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            options = (
                f"-k {self.sockets} -h 127.0.0.1 -p {self.port} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            )
            try:
                self._run(
                    [
                        str(self.bin / "pg_ctl"),
                        "-D",
                        str(self.data),
                        "-l",
                        str(self.log),
                        "-o",
                        options,
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ],
                    "pg_ctl start",
                )
            except RuntimeError:
                if attempt == START_ATTEMPTS:  # the free port may have been taken meanwhile
                    raise
                continue
            self.running = True
            return

    def stop(self) -> None:
        try:
            if self.running:
                self._run(
                    [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"],
                    "pg_ctl stop",
                )
                self.running = False
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        """A SQLAlchemy URL of ``database``, with the superuser's password in it."""
        return URL.create(
            "postgresql+psycopg",
            username=SUPERUSER,
            password=self.password,
            host="127.0.0.1",
            port=self.port,
            database=database,
        ).render_as_string(hide_password=False)

    def version(self) -> str:
        engine = create_engine(self.url())
        try:
            with engine.connect() as connection:
                return str(connection.scalar(text("SHOW server_version")))
        finally:
            engine.dispose()

    def create_database(self) -> str:
        """Create a fresh, uniquely named database; return its name."""
        name = f"test_{uuid.uuid4().hex}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _admin(self, statement: str) -> None:
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(statement))
        finally:
            engine.dispose()
