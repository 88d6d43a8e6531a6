"""A Spark standalone cluster on loopback: one master and N workers, from pyspark's jars.

``spark-class`` ships inside the pyspark package, so no separate Spark download is needed.
The workers run on this machine and use this virtualenv's Python, so the project's modules
are importable by their Python workers.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

logger = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as answer:
            return int(json.load(answer).get("aliveworkers", 0))
    except OSError:
        return 0


@contextmanager
def standalone_cluster(
    root: Path, workers: int = 2, cores: int = 1, memory: str = "3g", timeout: float = 120.0
) -> Iterator[str]:
    """Start the cluster, yield its ``spark://`` URL once every worker registered, stop it."""
    spark_home = Path(pyspark.__file__).resolve().parent
    spark_class = str(spark_home / "bin" / "spark-class")
    root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPARK_HOME": str(spark_home), "SPARK_LOCAL_IP": "127.0.0.1"}
    port, ui_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        log = (root / f"{name}.log").open("wb")
        processes.append(
            subprocess.Popen([spark_class, *args], stdout=log, stderr=subprocess.STDOUT, env=env)
        )

    try:
        start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui_port),
        )  # fmt: skip
        for i in range(workers):
            start(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker", url,
                "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
                "--work-dir", str(root / f"worker{i}"), "--webui-port", str(free_port()),
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while _alive_workers(ui_port) < workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise RuntimeError(
                    f"the standalone cluster did not come up with {workers} workers in "
                    f"{timeout:.0f} s; see the logs in {root}"
                )
            time.sleep(1)
        logger.info("standalone cluster %s with %d worker(s) of %d core(s)", url, workers, cores)
        yield url
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
