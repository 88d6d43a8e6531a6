"""A throwaway S3-compatible object store on loopback: SeaweedFS, for the tests and the demo.

``weed mini`` (master, volume server, filer, S3 gateway and an admin server in one process,
SeaweedFS's own mode for development and tests) in a temporary folder, every port a free
one of 127.0.0.1 picked at start (two pytest workers each start their own), S3 requests
signed with a random secret, as a deployment's are. ``weed server`` runs the same S3 code,
but its filer joins the cluster only after a confirm window of several seconds, so that its
first conditional write answered 11 s after start where mini's answers after about 5 s; it
also needed a SIGKILL to stop within seconds, and mini stops cleanly in half a second.
The binary is ``var/bin/weed``, which ``make object-store-deps`` (part of ``make test``)
builds from the version the Makefile pins; without it the tests fail (never skip) and say so.
The server's Prometheus metrics are on a port of their own: :meth:`S3Server.request_counts`
reads its S3 request counters per bucket (the benchmarks' requests per interval).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from warehouse.object_store import ObjectStore

REPO_ROOT = Path(__file__).resolve().parent.parent
WEED = REPO_ROOT / "var" / "bin" / "weed"
HOST = "127.0.0.1"
REGION = "us-east-1"
ACCESS_KEY = "enrich-test"
START_ATTEMPTS = 3  # a free port may be taken by someone else before the server binds it
START_TIMEOUT_SECONDS = 60.0
PROBE_TIMEOUT_SECONDS = 5.0
# The server's folder is thrown away on stop, so a server that does not exit promptly is
# killed: waiting 5 s cost every test session and soak run its last seconds.
STOP_GRACE_SECONDS = 1.0
LOG_TAIL_CHARACTERS = 4000
PROBE_BUCKET = "readiness-probe"  # the start-up's own, written to once
PORT_TAKEN_SIGNS = ("is not available on", "address already in use")
# weed's own ports, each set explicitly: left out, a service takes a fixed default (or its
# HTTP port + 10000 for gRPC), and a second server on the machine would collide with it.
PORT_OPTIONS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "admin.port",
    "admin.port.grpc",
    # Prometheus metrics of every service (the S3 gateway's request counters among them).
    "metricsPort",
)
# The S3 gateway's counter of answered requests, labelled bucket, code (the HTTP status)
# and type: GET (HeadObject and HeadBucket included), PUT, LIST (ListObjects and
# ListBuckets), DELETE (DeleteObjects included), POST (multipart), COPY.
REQUEST_COUNTER = "SeaweedFS_s3_request_total"
METRICS_TIMEOUT_SECONDS = 10.0
# weed's in-process gRPC shortcuts: Unix sockets it names after each service's gRPC port in
# /tmp (no option moves them). A server that is killed leaves them behind.
GRPC_SOCKETS = {
    "master.port.grpc": "/tmp/seaweedfs-master-grpc-{}.sock",
    "volume.port.grpc": "/tmp/seaweedfs-volume-grpc-{}.sock",
    "filer.port.grpc": "/tmp/seaweedfs-filer-grpc-{}.sock",
    "s3.port.grpc": "/tmp/seaweedfs-s3-grpc-{}.sock",
    "admin.port.grpc": "/tmp/seaweedfs-admin-grpc-{}.sock",
}


class S3ServerError(RuntimeError):
    """The server did not start (or exited); the message carries the tail of its log."""


def weed_binary() -> Path:
    """``var/bin/weed``, or an error that says how to build it."""
    if not (WEED.is_file() and os.access(WEED, os.X_OK)):
        raise S3ServerError(
            f"the SeaweedFS server binary {WEED} is missing (or is a dangling link); run "
            "`make object-store-deps` (part of `make test`), which builds the version the "
            "Makefile pins with Go, once per user, and links it there"
        )
    return WEED


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports nothing listens on at 127.0.0.1 right now (the kernel's
    picks, all held open together so that none is handed out twice)."""
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind((HOST, 0))
        return [int(probe.getsockname()[1]) for probe in probes]


class S3Server:
    """One SeaweedFS cluster with an S3 gateway in a temporary folder; :meth:`start`, then
    :meth:`stop` (see :func:`started_s3_server`)."""

    def __init__(self) -> None:
        self.binary = weed_binary()
        # Short: weed's local Unix sockets live here, and their paths are limited to ~100 bytes.
        self.base = Path(tempfile.mkdtemp(prefix="enrich-s3-"))
        self.data, self.log = self.base / "data", self.base / "server.log"
        self.access_key = ACCESS_KEY
        self.secret_key = secrets.token_urlsafe(24)
        self.region = REGION
        self.ports: dict[str, int] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{HOST}:{self.ports['metricsPort']}/metrics"

    def request_counts_by_code(self, bucket: str) -> dict[tuple[str, str], int]:
        """The S3 requests the server has answered for ``bucket`` since it started, by
        (type, HTTP status code), from its Prometheus counter (:data:`REQUEST_COUNTER`)."""
        with urllib.request.urlopen(self.metrics_url, timeout=METRICS_TIMEOUT_SECONDS) as answer:
            text = answer.read().decode()
        counts: dict[tuple[str, str], int] = {}
        for line in text.splitlines():
            if not line.startswith(REQUEST_COUNTER + "{"):
                continue
            labels_text, _, value = line[len(REQUEST_COUNTER) + 1 :].rpartition("} ")
            labels = _labels(labels_text)
            if labels.get("bucket") == bucket:
                key = (labels.get("type", ""), labels.get("code", ""))
                counts[key] = counts.get(key, 0) + int(float(value))
        return counts

    def request_counts(self, bucket: str) -> dict[str, int]:
        """The S3 requests answered for ``bucket`` since the server started, by type (GET,
        PUT, LIST, DELETE, POST, COPY as the server labels them), summed over status codes."""
        counts: dict[str, int] = {}
        for (kind, _code), count in self.request_counts_by_code(bucket).items():
            counts[kind] = counts.get(kind, 0) + count
        return counts

    def client(
        self, *, attempts: int = 3, max_pool_connections: int = 32, timeout: float = 60.0
    ) -> Any:
        """A boto3 S3 client of the server, path-style addressing (``endpoint/bucket/key``).

        ``attempts=1`` shows every request's own answer (no retry hides an error);
        ``timeout`` bounds each wait for an answer."""
        return ObjectStore.from_environment(self.environment()).client(
            # total_max_attempts counts the first try (botocore's max_attempts does not).
            retries={"total_max_attempts": attempts, "mode": "standard"},
            max_pool_connections=max_pool_connections,
            connect_timeout=min(timeout, 5.0),
            read_timeout=timeout,
        )

    def create_bucket(self, prefix: str = "test") -> str:
        """Create a fresh, uniquely named bucket; return its name (``<prefix>-<hex>``)."""
        name = f"{prefix.lower()}-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name

    def environment(self) -> dict[str, str]:
        """The variables that point warehouse.object_store (and boto3, delta-rs) here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def log_tail(self) -> str:
        if not self.log.exists():
            return "(no server log)"
        return self.log.read_text(errors="replace")[-LOG_TAIL_CHARACTERS:]

    def start(self) -> None:
        identities = {
            "identities": [
                {
                    "name": "enrich",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        config = self.base / "s3.json"
        config.write_text(json.dumps(identities))
        config.chmod(0o600)
        started = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            shutil.rmtree(self.data, ignore_errors=True)  # a failed attempt's state
            self.data.mkdir()
            self.ports = dict(zip(PORT_OPTIONS, free_ports(len(PORT_OPTIONS)), strict=True))
            try:
                self._launch(config)
            except S3ServerError as error:
                self._terminate()
                # mini checks its ports first ("... is not available"); a port taken after
                # the check fails its bind ("address already in use").
                taken = any(sign in str(error) for sign in PORT_TAKEN_SIGNS)
                if attempt == START_ATTEMPTS or not taken:
                    raise
                continue
            self.start_seconds = time.monotonic() - started
            return

    def _launch(self, config: Path) -> None:
        argv = [
            str(self.binary),
            "mini",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-dir={self.data}",
            # Explicit ports: mini refuses to start if one is taken (it moves only defaults).
            *(f"-{option}={port}" for option, port in self.ports.items()),
            f"-s3.config={config}",
            f"-filer.localSocket={self.base / 'filer.sock'}",
            f"-s3.localSocket={self.base / 's3.sock'}",
            # Off: the WebDAV gateway, the admin's web UI and its legacy port, the S3
            # Iceberg and Lance catalogs (they take fixed ports: 7333, 23646, 8181, 9101).
            "-webdav=false",
            "-admin.ui=false",
            "-admin.port.legacy=0",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            # As on AWS: a PUT into a bucket nobody created fails (NoSuchBucket).
            "-s3.autoCreateBucket=false",
            "-master.telemetry=false",
            # Every bucket is a collection with volumes of its own (mini grows one at a time):
            # 64 MB volumes, up to 1,000 (sparse files), so that a run's many buckets fit.
            # By default mini sizes volumes to the free disk, 1 GiB each, a few dozen.
            "-master.volumeSizeLimitMB=64",
            "-volume.max=1000",
            "-volume.preStopSeconds=0",
        ]
        # WEED_* variables configure weed (security.toml and the like): none leaks in.
        env = {k: v for k, v in os.environ.items() if not k.startswith("WEED_")}
        with self.log.open("wb") as log:  # this attempt's log only
            self.process = subprocess.Popen(
                argv, cwd=self.base, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        """Until a signed request answers: ListBuckets, then a conditional PUT into a probe
        bucket (the first write waits for the filers' lock ring, which comes up a moment
        after the S3 port)."""
        assert self.process is not None
        # Short waits: a port taken by another program that accepts but never answers
        # would otherwise hold each probe for a minute.
        probe = self.client(attempts=1, timeout=PROBE_TIMEOUT_SECONDS)

        def create_probe_bucket() -> None:
            try:
                probe.create_bucket(Bucket=PROBE_BUCKET)
            except ClientError as error:  # an earlier try that timed out, yet succeeded
                if error.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                    raise

        def put_conditionally() -> None:  # a fresh key each try, for the same reason
            probe.put_object(Bucket=PROBE_BUCKET, Key=uuid.uuid4().hex, IfNoneMatch="*")

        steps = [probe.list_buckets, create_probe_bucket, put_conditionally]
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        last: Exception | None = None
        while True:
            code = self.process.poll()
            if code is not None:
                raise S3ServerError(
                    f"weed mini exited with code {code} while starting on ports "
                    f"{self.ports}\nserver log ({self.log}):\n{self.log_tail()}"
                )
            try:
                steps[0]()
            except (BotoCoreError, ClientError) as error:
                last = error
            else:
                steps.pop(0)
                if not steps:
                    return
                continue
            if time.monotonic() > deadline:
                raise S3ServerError(
                    f"weed mini did not answer S3 requests at {self.endpoint} within "
                    f"{START_TIMEOUT_SECONDS:.0f} s (last error: {last})\nserver log "
                    f"({self.log}):\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _terminate(self) -> None:
        """SIGTERM, a short grace, SIGKILL; then the /tmp sockets a killed server left."""
        process, self.process = self.process, None
        if process is None:
            return
        killed = False
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                killed = True
        if killed:
            for option, pattern in GRPC_SOCKETS.items():
                Path(pattern.format(self.ports[option])).unlink(missing_ok=True)

    def stop(self) -> None:
        try:
            self._terminate()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


def _labels(text: str) -> dict[str, str]:
    """``name="value",...`` of a Prometheus sample (values never hold a quote here: bucket
    names, status codes and request types)."""
    labels = {}
    for part in text.split('",'):
        name, _, value = part.partition('="')
        labels[name.strip()] = value.rstrip('"')
    return labels


def started_s3_server() -> S3Server:
    """A started :class:`S3Server` (its folder removed again if it fails to start)."""
    server = S3Server()
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
