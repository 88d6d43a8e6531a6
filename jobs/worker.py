"""A warm pipeline worker: one long-lived process runs the ``enrich`` commands of many
short-lived clients (the DAG's tasks), so Python's imports, the Spark session, the JIT and
the first touch of every table are paid once, not once per task.

Why: an Airflow task process that runs its command itself pays, before any work, Python
and its imports (pyspark, Great Expectations: 2-5 s), a Spark session (5-6 s with the
class-data archive) and cold first jobs: an equi20k interval (``benchmarks/interval_cost.py``)
cost 88 s as four task processes and 22 s over a warm Spark Connect server (whose clients
still import GX and pay their own Python), against 3.9 s for the same commands in one warm
process. A client of this worker imports neither Spark nor GX, nor the CLI's parser: it
reads its global options alone (``jobs.worker_request``) and the worker parses the rest.

Protocol: one Unix socket per worker, one connection per command, JSON lines.

- client -> worker: ``{"argv": [...], "env": {...}, "cwd": "..."}`` (or ``{"stop": true}``);
- worker -> client: any number of ``{"log": {...}}``, ``{"out": "..."}``, ``{"err": "..."}``
  as the command runs, then ``{"exit": N}``.

A connection that ends without an ``exit`` line means the worker died mid-command (a
crash, a kill): the client reports exit 1, as for a task process that died, and the next
command starts a new worker.

Invariants:

- one command at a time, in the order clients connect: one Spark session, and the
  pipeline's lease serialises writers anyway;
- a worker is keyed by what fixes its process (:func:`worker_key`): the interpreter, the
  working directory, the config file's path and content, ``--master`` and the environment
  variables that shape the session (``SESSION_ENV``); a client whose key differs starts
  its own worker;
- a command runs with its client's whole environment (``os.environ`` swapped for its
  duration) and crash-point counts reset, so ``${VAR}`` secrets, ``ENRICH_STATE_STORE`` and
  fault injection behave as in a process of its own;
- the worker exits after ``idle_timeout`` seconds without a command, after
  ``max_commands`` commands, on SIGTERM or a stop request (after the command in progress),
  or once its Spark driver is gone; a client that finds no worker starts one, one at a time
  (a lock file).

A client killed mid-command (Airflow's timeout) does not stop the command: it finishes in
the worker, holding the lease, and a retry waits for it in the queue.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from common.errors import EXIT_CONFIG, EXIT_ERROR, EXIT_OK, ConfigError, EnrichmentError

logger = logging.getLogger(__name__)

# Environment variables that shape the worker's process or its Spark session: they are
# part of its key. A named list, not prefixes: pyspark sets PYSPARK_* and SPARK_* variables
# in any process that starts Spark, which must not change the key it computes. Everything
# else (the state store's URL, a crash point, secrets) is per command: a command runs with
# its client's environment.
SESSION_ENV = frozenset(
    {
        "SPARK_MASTER",
        "SPARK_REMOTE",
        "SPARK_HOME",
        "SPARK_CONF_DIR",
        "PYSPARK_SUBMIT_ARGS",
        "JAVA_HOME",
        "JAVA_TOOL_OPTIONS",
        "ENRICH_JVM_ARCHIVE",
        "ENRICH_OBJECT_STORE_JARS",
        "ENRICH_DELTA_JARS",
        "ENRICH_CODE_DIR",
    }
)
START_TIMEOUT_SECONDS = 180.0
SOCKET_DIR_ENV = "ENRICH_WORKER_DIR"
LOG_TAIL_BYTES = 4000


class WorkerError(EnrichmentError):
    """A worker could not be started or reached."""


@dataclass(frozen=True)
class WorkerAddress:
    """Where the worker of one key listens, logs and is started from."""

    socket: Path
    lock: Path
    log: Path

    @classmethod
    def of(cls, key: str, folder: Path | None = None) -> WorkerAddress:
        base = folder or worker_folder()
        return cls(base / f"{key}.sock", base / f"{key}.lock", base / f"{key}.log")


def worker_folder() -> Path:
    """``ENRICH_WORKER_DIR``, else a folder of this user's in the temp directory (a Unix
    socket's path must stay short: about 100 bytes)."""
    configured = os.environ.get(SOCKET_DIR_ENV)
    folder = (
        Path(configured)
        if configured
        else Path(tempfile.gettempdir()) / f"enrich-workers-{os.getuid()}"
    )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def worker_key(config: Path, master: str | None, environ: Mapping[str, str], cwd: Path) -> str:
    """The key of the worker a command may run in: equal keys, interchangeable workers."""
    config_path = (cwd / config).resolve()
    try:
        content = config_path.read_bytes()
    except OSError as e:
        raise WorkerError(f"expected a readable pipeline config at {config_path}: {e}") from e
    session_env = sorted((name, value) for name, value in environ.items() if name in SESSION_ENV)
    digest = hashlib.sha256()
    for part in (sys.executable, str(cwd.resolve()), str(config_path), master or ""):
        digest.update(part.encode() + b"\0")
    digest.update(hashlib.sha256(content).digest())
    digest.update(json.dumps(session_env).encode())
    return digest.hexdigest()[:20]


def _address(config: Path, master: str | None) -> WorkerAddress:
    return WorkerAddress.of(worker_key(config, master, os.environ, Path.cwd()))


def worker_socket(config: Path, master: str | None = None) -> Path:
    """The socket the clients of this config and ``master`` look for, from here."""
    return _address(config, master).socket


def _worker_options(config: Path, master: str | None) -> list[str]:
    return ["--config", str(config), *(["--master", master] if master else [])]


# ---------------------------------------------------------------------------- client


def run_in_worker(
    argv: Sequence[str],
    config: Path,
    master: str | None = None,
    *,
    out: IO[str] | None = None,
    err: IO[str] | None = None,
) -> int:
    """Run ``enrich ARGV`` (its ``--config`` is ``config``, its ``--master`` ``master``) in
    that config's worker, starting one if none answers. The worker's log records are
    re-emitted here, its output written to ``out``/``err``. Returns the exit code."""
    address = _address(config, master)
    connection = _connect(address) or _start(address, _worker_options(config, master))
    started = time.perf_counter()
    with connection:
        _send(connection, {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd()})
        code = _relay(connection, out or sys.stdout, err or sys.stderr)
    if code is None:
        logger.error(
            "the pipeline worker ended while running `enrich %s` (killed, or it crashed); "
            "its log %s ends with:\n%s",
            " ".join(argv),
            address.log,
            _tail(address.log),
        )
        return EXIT_ERROR
    logger.debug(
        "enrich %s in the worker: exit %d after %.2fs",
        " ".join(argv),
        code,
        time.perf_counter() - started,
    )
    return code


def stop_worker(config: Path, master: str | None = None) -> bool:
    """Ask the worker of this config to exit; False when none was running."""
    return _stop(_address(config, master))


def stop_workers_in(folder: Path) -> int:
    """Stop every worker listening in ``folder``; how many were stopped."""
    addresses = [
        WorkerAddress(path, path.with_suffix(".lock"), path.with_suffix(".log"))
        for path in sorted(folder.glob("*.sock"))
    ]
    return sum(_stop(address) for address in addresses)


def _stop(address: WorkerAddress) -> bool:
    """Ask the worker at ``address`` to exit; False when none answers there."""
    connection = _connect(address)
    if connection is None:
        return False
    with connection:
        _send(connection, {"stop": True})
        _relay(connection, sys.stdout, sys.stderr)
    return True


def _connect(address: WorkerAddress) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(address.socket))
    except (FileNotFoundError, ConnectionRefusedError):
        connection.close()
        return None
    return connection


def _start(address: WorkerAddress, options: Sequence[str]) -> socket.socket:
    """Start this key's worker unless another client just did; connected to it."""
    with _locked(address.lock):
        connection = _connect(address)  # another client may have started it meanwhile
        if connection is not None:
            return connection
        address.socket.unlink(missing_ok=True)  # left by a worker that was killed
        command = [
            sys.executable,
            "-m",
            "jobs.enrich",
            *options,
            "worker",
            "--socket",
            str(address.socket),
        ]
        logger.info("starting a pipeline worker (log %s)", address.log)
        with address.log.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the task that started it
            )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            connection = _connect(address)
            if connection is not None:
                logger.info("pipeline worker %d listening on %s", process.pid, address.socket)
                return connection
            if process.poll() is not None:
                message = (
                    f"expected the pipeline worker to listen on {address.socket}; it exited "
                    f"with code {process.returncode}, and its log {address.log} ends with:\n"
                    + _tail(address.log)
                )
                # A config the worker cannot load fails the command as a config error
                # (exit 2, no retries), as it would in a process of its own.
                raise (ConfigError if process.returncode == EXIT_CONFIG else WorkerError)(message)
            time.sleep(0.05)
        process.terminate()
        raise WorkerError(
            f"expected the pipeline worker to listen on {address.socket} within "
            f"{START_TIMEOUT_SECONDS:.0f}s; its log {address.log} ends with:\n" + _tail(address.log)
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _relay(connection: socket.socket, out: IO[str], err: IO[str]) -> int | None:
    """Replay the worker's messages here until its exit code; None if it never came."""
    for message in _messages(connection):
        if "log" in message:
            record = logging.makeLogRecord(message["log"])
            logging.getLogger(record.name).handle(record)
        elif "out" in message:
            out.write(message["out"])
            out.flush()
        elif "err" in message:
            err.write(message["err"])
            err.flush()
        elif "exit" in message:
            return int(message["exit"])
    return None


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_TAIL_BYTES))
            return handle.read().decode(errors="replace")
    except OSError as e:
        return f"(no log: {e})"


# ---------------------------------------------------------------------------- protocol


def _send(connection: socket.socket, message: Mapping[str, Any]) -> None:
    connection.sendall(json.dumps(message, default=str).encode() + b"\n")


def _messages(connection: socket.socket) -> Iterator[dict[str, Any]]:
    with connection.makefile("rb") as lines:
        for line in lines:
            yield json.loads(line)


# ---------------------------------------------------------------------------- worker


@dataclass(frozen=True)
class WorkerLimits:
    idle_timeout_seconds: float
    max_commands: int


def serve(
    address: Path,
    limits: WorkerLimits,
    run: Callable[[list[str]], int],
    alive: Callable[[], bool],
) -> int:
    """Answer commands on ``address`` with ``run(argv)`` until a limit ends the worker."""
    stopping: list[int] = []

    def stop(signum: int, frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, stop)
    address.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(address))
    os.chmod(address, 0o600)  # the commands run as this user
    listener.listen(64)
    logger.info(
        "pipeline worker %d on %s (idle timeout %.0fs, at most %d commands)",
        os.getpid(),
        address,
        limits.idle_timeout_seconds,
        limits.max_commands,
    )
    done = 0
    try:
        while not stopping and done < limits.max_commands:
            listener.settimeout(min(limits.idle_timeout_seconds, 1.0))
            idle_since = time.monotonic()
            connection = None
            while connection is None and not stopping:
                try:
                    connection, _ = listener.accept()
                except TimeoutError:
                    if time.monotonic() - idle_since >= limits.idle_timeout_seconds:
                        logger.info(
                            "pipeline worker idle for %.0fs: exiting", time.monotonic() - idle_since
                        )
                        return EXIT_OK
            if connection is None:
                break
            with connection:
                connection.settimeout(None)
                if not _answer(connection, run):
                    logger.info("pipeline worker stopped on request")
                    return EXIT_OK
            done += 1
            if not alive():
                logger.error("the Spark driver of this worker is gone: exiting")
                return EXIT_ERROR
        logger.info("pipeline worker exiting after %d command(s)", done)
        return EXIT_OK
    finally:
        listener.close()
        address.unlink(missing_ok=True)


def _answer(connection: socket.socket, run: Callable[[list[str]], int]) -> bool:
    """Run one request's command, streaming its output; False for a stop request."""
    reply = _Reply(connection)
    with connection.makefile("rb") as lines:
        line = lines.readline()
    if not line:
        return True  # a client that connected and left
    request = json.loads(line)
    if request.get("stop"):
        reply.send({"exit": EXIT_OK})
        return False
    argv = [str(arg) for arg in request["argv"]]
    logger.info("worker: enrich %s", " ".join(argv))
    code = EXIT_ERROR
    with _client_environment(request["env"], Path(request["cwd"])), reply.capturing():
        try:
            code = run(argv)
        except Exception:  # the process boundary: a task process would exit 1 here too
            logger.exception("enrich %s failed", " ".join(argv))
    reply.send({"exit": code})
    return True


@contextlib.contextmanager
def _client_environment(environ: Mapping[str, str], cwd: Path) -> Iterator[None]:
    from common.faults import reset_crash_counts

    saved, saved_cwd = dict(os.environ), Path.cwd()
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    reset_crash_counts()  # as in a process of its own
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        os.chdir(saved_cwd)


class _Reply:
    """The worker's side of one connection: messages, forwarded log records and output.
    A client that went away (killed by its timeout) no longer receives; the command goes on."""

    def __init__(self, connection: socket.socket) -> None:
        self._connection = connection
        self._open = True

    def send(self, message: Mapping[str, Any]) -> None:
        if not self._open:
            return
        try:
            _send(self._connection, message)
        except OSError:
            self._open = False
            logger.warning("the client of this command went away; the command goes on")

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        handler = _ForwardingHandler(self)
        root = logging.getLogger()
        root.addHandler(handler)
        try:
            with (
                contextlib.redirect_stdout(_Stream(self, "out")),
                contextlib.redirect_stderr(_Stream(self, "err")),
            ):
                yield
        finally:
            root.removeHandler(handler)


class _ForwardingHandler(logging.Handler):
    def __init__(self, reply: _Reply) -> None:
        super().__init__()
        self._reply = reply

    def emit(self, record: logging.LogRecord) -> None:
        fields = {
            "name": record.name,
            "levelno": record.levelno,
            "levelname": record.levelname,
            "msg": record.getMessage(),
            "created": record.created,
            "msecs": record.msecs,
            "process": record.process,
        }
        if record.exc_info:
            fields["exc_text"] = logging.Formatter().formatException(record.exc_info)
        self._reply.send({"log": fields})


class _Stream(io.TextIOBase):
    def __init__(self, reply: _Reply, kind: str) -> None:
        self._reply = reply
        self._kind = kind

    def write(self, text: str) -> int:
        if text:
            self._reply.send({self._kind: text})
        return len(text)


def spark_driver_alive() -> bool:
    """False once this process's in-process Spark driver has stopped or its JVM is gone."""
    if "pyspark" not in sys.modules:
        return True
    from py4j.protocol import Py4JError
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return True  # none started yet, or a Spark Connect session
    try:
        return not context._jsc.sc().isStopped()
    except (Py4JError, OSError):
        return False
