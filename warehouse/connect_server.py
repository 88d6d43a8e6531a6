"""A Spark Connect server the pipeline's commands share: one warm JVM instead of one per task.

Spark 4 ships the server in pyspark's own jars (``spark-connect_2.13``); it is started with
``spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer``. The command
built here gives it what :func:`warehouse.spark.build_session` gives an in-process session:

- the settings every job relies on (``REQUIRED_CONF``: UTC, INT64 timestamps, the raw local
  file system, no ``_SUCCESS`` markers); the ``spark.hadoop.*`` ones are static, so a client
  cannot set them later and they must be on the server's command line;
- the embedded defaults and the config's ``spark.conf``, and the delta-spark jars when
  ``make jars`` fetched them;
- Python workers running this interpreter, so the UDF code (``joins``, ``cache``) imports
  as it does in-process.

``ConnectServer`` starts it on a loopback (or given) address, waits until the port answers,
and stops the whole process group on exit. ``enrich spark-server`` runs it in the foreground.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from common.errors import SparkServerError
from warehouse.connect_address import DEFAULT_HOST, DEFAULT_PORT, RemoteAddress, port_answers

logger = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_SECONDS = 180.0
STOP_TIMEOUT_SECONDS = 30.0
LOG_TAIL_LINES = 30
# pyspark's switches to client mode: a server launched with one of them would not start.
CLIENT_MODE_VARIABLES = (
    "SPARK_REMOTE",
    "SPARK_CONNECT_MODE_ENABLED",
    "SPARK_LOCAL_REMOTE",
    "SPARK_API_MODE",
)


@dataclass(frozen=True)
class ConnectServerSettings:
    """How to run the server: its address, Spark master, extra settings and log file."""

    address: RemoteAddress = field(
        default_factory=lambda: RemoteAddress(DEFAULT_HOST, DEFAULT_PORT)
    )
    master: str = "local[2]"
    conf: Mapping[str, str] = field(default_factory=dict)
    app_name: str = "enrich-connect"
    log_file: Path | None = None


def spark_submit() -> Path:
    """pyspark's own ``spark-submit`` script (the pip package ships Spark's launcher)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SparkServerError("pyspark is not installed in this interpreter")
    script = Path(spec.origin).parent / "bin" / "spark-submit"
    if not script.is_file():
        raise SparkServerError(f"expected pyspark's launcher at {script}; it is missing")
    return script


def server_command(settings: ConnectServerSettings) -> list[str]:
    """The ``spark-submit`` command line that runs the server with the product's settings."""
    from warehouse.spark import session_conf

    conf = session_conf(settings.conf, settings.master)
    conf["spark.connect.grpc.binding.address"] = settings.address.host
    conf["spark.connect.grpc.binding.port"] = str(settings.address.port)
    command = [
        str(spark_submit()),
        "--class",
        SERVER_CLASS,
        "--name",
        settings.app_name,
        "--master",
        settings.master,
    ]
    for key, value in sorted(conf.items()):
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def _signal_group(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group exited on its own meanwhile
        os.killpg(pid, number)


def free_port(host: str = DEFAULT_HOST) -> int:
    """A TCP port nothing listens on at ``host`` right now (the kernel's pick)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class ConnectServer:
    """A Spark Connect server process; a context manager that starts and stops it.

    Start-up fails loudly: a port already taken, a server that exits, or one that does not
    answer within ``START_TIMEOUT_SECONDS`` raise :class:`SparkServerError` with the tail of
    its log.
    """

    def __init__(self, settings: ConnectServerSettings) -> None:
        self.settings = settings
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path = settings.log_file

    @property
    def url(self) -> str:
        return self.settings.address.url

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> ConnectServer:
        address = self.settings.address
        if port_answers(address):
            raise SparkServerError(
                f"cannot start a Spark Connect server on {address.host}:{address.port}: "
                "something already listens there (another server? use it with "
                f"spark.remote: {address.url}, or pick another port)"
            )
        command = server_command(self.settings)
        if self._log_path is None:
            self._log_path = Path(tempfile.gettempdir()) / f"enrich-connect-{address.port}.log"
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
        for name in CLIENT_MODE_VARIABLES:  # the server itself runs classic Spark
            env.pop(name, None)
        logger.info("starting Spark Connect server on %s (log %s)", address.url, self._log_path)
        with open(self._log_path, "wb") as log:
            # Its own process group: stop() ends the launcher and the JVM it forks together.
            self._process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        try:
            self._wait_until_listening(timeout)
        except BaseException:
            # Ctrl-C or SIGTERM while waiting included: the server runs in its own session,
            # so nothing else would ever stop it.
            self.stop()
            raise
        return self

    def _wait_until_listening(self, timeout: float) -> None:
        address = self.settings.address
        started = time.monotonic()
        while not port_answers(address):
            assert self._process is not None
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise SparkServerError(
                    f"the Spark Connect server exited with code {code} before it listened on "
                    f"{address.url}; its log {self._log_path} ends with:\n{self.log_tail()}"
                )
            if time.monotonic() - started > timeout:
                raise SparkServerError(
                    f"the Spark Connect server did not listen on {address.url} within "
                    f"{timeout:.0f}s; its log {self._log_path} ends with:\n{self.log_tail()}"
                )
            time.sleep(0.25)
        logger.info(
            "Spark Connect server listening on %s after %.1fs",
            address.url,
            time.monotonic() - started,
        )

    def wait(self) -> int:
        """Block until the server exits; its exit code."""
        if self._process is None:
            raise SparkServerError("the Spark Connect server was not started")
        return self._process.wait()

    def stop(self) -> None:
        """Stop the server's process group: SIGTERM, then SIGKILL after a grace period."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        # A second Ctrl-C or SIGTERM must not cut the shutdown short and orphan the JVM.
        # (Signal handlers can only be changed from the main thread.)
        main_thread = threading.current_thread() is threading.main_thread()
        signals = (signal.SIGINT, signal.SIGTERM) if main_thread else ()
        previous = {number: signal.signal(number, signal.SIG_IGN) for number in signals}
        try:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("Spark Connect server ignored SIGTERM; killing it")
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
        logger.info("Spark Connect server on %s stopped", self.url)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self._log_path is None or not self._log_path.exists():
            return "(no log)"
        text = self._log_path.read_text(errors="replace").splitlines()
        tail = text[-lines:]
        # A JVM failure ends in a stack trace; the line that says what went wrong is above it.
        causes = [
            line
            for line in text[: len(text) - len(tail)]
            if ("Exception" in line or "ERROR" in line) and not line.lstrip().startswith("at ")
        ][:3]
        return "\n".join([*causes, "...", *tail] if causes else tail)

    def __enter__(self) -> ConnectServer:
        return self if self._process is not None else self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
