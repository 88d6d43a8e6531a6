"""A Spark standalone cluster on loopback for the tests: one master and two workers.

Started with the ``spark-class`` launcher of the installed pyspark package (the same Spark
the pipeline runs), each worker with one core, so the cluster has two executors' worth of
slots on this machine. :func:`spark_cluster` waits until the master's JSON status page
lists every worker ALIVE, and stops the processes (SIGTERM, then SIGKILL) afterwards.

``hidden_from_workers`` runs the workers (and so the executors) in a mount namespace of
their own in which those folders are empty (a tmpfs over each), with work folders outside
them: as on a cluster whose hosts share no disk with the driver, an executor cannot read
the driver's files, so whatever it reads must reach it another way (the object store, the
files and jars Spark ships). The Python and Spark installation stays visible, as a
cluster's hosts have their own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pyspark

from warehouse.connect_server import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass(frozen=True)
class SparkCluster:
    url: str  # spark://127.0.0.1:<port>
    status_url: str  # the master's JSON status page
    logs: Path
    worker_pids: tuple[int, ...]  # the workers' JVMs (their executors are their children)

    def listings_on_workers(self, folder: Path) -> list[list[str]]:
        """What each worker's JVM (and so its executors) sees in ``folder``: read through
        ``/proc/<pid>/root``, which resolves paths in that process's mount namespace."""
        return [sorted(os.listdir(f"/proc/{pid}/root{folder}")) for pid in self.worker_pids]

    def status(self) -> dict[str, object]:
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            return dict(json.load(response))

    def alive_workers(self) -> int:
        try:
            workers = self.status().get("workers", [])
        except OSError:
            return 0
        return sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE")


# Mounts an empty tmpfs over each of the first N arguments, then runs the rest.
_HIDE = (
    'n=$1; shift; while [ "$n" -gt 0 ]; do mount -t tmpfs -o size=64k,mode=0755 none "$1" '
    '|| exit 97; shift; n=$((n - 1)); done; exec "$@"'
)


def _launch(
    args: list[str], log: Path, env: dict[str, str], hidden: Sequence[Path] = ()
) -> subprocess.Popen[bytes]:
    handle = log.open("wb")
    prefix = (
        [
            *("unshare", "--mount", "--propagation", "private", "--"),
            *("sh", "-c", _HIDE, "sh", str(len(hidden)), *map(str, hidden)),
        ]
        if hidden
        else []
    )
    return subprocess.Popen(
        [*prefix, str(SPARK_HOME / "bin" / "spark-class"), *args],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def spark_cluster(
    base: Path,
    workers: int = 2,
    worker_memory: str = "2g",
    timeout: float = 180,
    hidden_from_workers: Sequence[Path] = (),
) -> Iterator[SparkCluster]:
    base.mkdir(parents=True, exist_ok=True)
    # The workers' own folders, outside every hidden one.
    worker_root = Path(tempfile.mkdtemp(prefix="enrich-workers-")) if hidden_from_workers else base
    port, ui_port = free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(base / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    url, status_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui_port}/json/"
    processes = [
        _launch(
            [MASTER_CLASS, "--host", "127.0.0.1", "--port", str(port), "--webui-port",
             str(ui_port)],
            base / "master.log",
            env,
        )
    ]  # fmt: skip
    try:
        for index in range(workers):
            work = worker_root / f"worker{index}"
            work.mkdir(exist_ok=True)
            processes.append(
                _launch(
                    [
                        WORKER_CLASS,
                        *("--host", "127.0.0.1", "--cores", "1", "--memory", worker_memory),
                        *("--webui-port", str(free_port()), "--work-dir", str(work)),
                        url,
                    ],
                    base / f"worker{index}.log",
                    {**env, "SPARK_LOG_DIR": str(work / "logs")} if hidden_from_workers else env,
                    hidden_from_workers,
                )
            )
        # unshare, sh and spark-class each exec the next: a worker's pid is its JVM's.
        cluster = SparkCluster(url, status_url, base, tuple(p.pid for p in processes[1:]))
        deadline = time.monotonic() + timeout
        while cluster.alive_workers() < workers:
            for process in processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"a Spark cluster process exited with {process.returncode}; logs in {base}"
                    )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{workers} Spark workers not ALIVE in {timeout}s; logs in {base}"
                )
            time.sleep(1)
        yield cluster
    finally:
        for process in reversed(processes):
            _stop(process)
        if hidden_from_workers:
            shutil.rmtree(worker_root, ignore_errors=True)
