"""A class-data-sharing archive of the Spark driver's JVM: every process starts faster.

Every ``enrich`` command, Airflow task and Connect server starts a Spark driver JVM, and
most of its start-up is loading and verifying the same ~20,000 Spark classes. Java 17's
dynamic CDS archive (JEP 350) stores them once, parsed and verified, in a file the JVM maps
at start. Measured on the 2-core reference machine (``local[2]``, no delta-spark jars):
session start 8.4-8.5 s -> 5.9-6.1 s, the first job 3.0 s -> 1.5-1.6 s.

- ``make setup`` builds it (``python -m warehouse.jvm_archive``): a child process
  (:mod:`warehouse.jvm_archive_training`) runs a small training workload (DataFrames,
  Parquet, a join, an aggregate, Arrow both ways, a Python UDF) with
  ``-XX:ArchiveClassesAtExit``, and the file is moved into place only once the JVM wrote it
  whole.
- :func:`with_class_archive` adds ``-XX:SharedArchiveFile`` to
  ``spark.driver.extraJavaOptions`` when the archive exists, unless the options already
  choose a CDS setting. The archive is named after the pyspark version (Spark's jars are
  its class path); a JVM that finds it does not match (another Java, another class path)
  ignores it and starts as it would without it, so a stale file costs nothing but its
  benefit.

``ENRICH_JVM_ARCHIVE`` names another file; an empty value turns the archive off.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

ARCHIVE_ENV = "ENRICH_JVM_ARCHIVE"
DRIVER_OPTIONS = "spark.driver.extraJavaOptions"
DRIVER_CLASS_PATH = "spark.driver.extraClassPath"
ARCHIVE_DIR = Path(__file__).resolve().parent.parent / "var" / "jvm"
# Options by which the caller already decided class data sharing for the driver.
CDS_OPTIONS = ("-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-Xshare")


def _pyspark_version() -> str:
    from pyspark.version import __version__

    return str(__version__)


def archive_path() -> Path | None:
    """``$ENRICH_JVM_ARCHIVE`` (None when it is set empty), else
    ``<repo>/var/jvm/spark-driver-<pyspark version>.jsa``."""
    configured = os.environ.get(ARCHIVE_ENV)
    if configured is not None:
        return Path(configured) if configured.strip() else None
    return ARCHIVE_DIR / f"spark-driver-{_pyspark_version()}.jsa"


def class_path_record(archive: Path) -> Path:
    """The file beside ``archive`` holding the driver class path it was trained with."""
    return archive.with_name(archive.name + ".classpath")


def with_class_archive(conf: Mapping[str, str], archive: Path | None) -> dict[str, str]:
    """``conf`` with the driver mapping ``archive`` at start, when the file exists, the
    driver's Java options do not already choose a CDS setting of their own, and the driver's
    class path (``spark.driver.extraClassPath``) is the one the archive was trained with: a
    JVM given an archive of another class path ignores it and prints a warning on every
    start (a session without delta-spark's jars, ``ENRICH_DELTA_JARS=``)."""
    merged = dict(conf)
    if archive is None or not archive.is_file():
        return merged
    options = merged.get(DRIVER_OPTIONS, "")
    if any(option in options for option in CDS_OPTIONS):
        return merged
    record = class_path_record(archive)
    if record.is_file() and record.read_text() != merged.get(DRIVER_CLASS_PATH, ""):
        logger.debug("class archive %s: trained with another driver class path", archive)
        return merged
    merged[DRIVER_OPTIONS] = f"{options} -XX:SharedArchiveFile={archive}".strip()
    return merged


def build(target: Path) -> None:
    """Write the archive to ``target`` from a training run in a child process."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    class_path_record(partial).unlink(missing_ok=True)
    env = {**os.environ, ARCHIVE_ENV: ""}  # the training JVM must not map an older archive
    env.pop("SPARK_REMOTE", None)
    done = subprocess.run(
        [sys.executable, "-m", "warehouse.jvm_archive_training", str(partial)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not partial.is_file() or not class_path_record(partial).is_file():
        raise RuntimeError(
            f"expected the training run to write {partial}; it exited {done.returncode}: "
            f"{done.stderr[-2000:]}"
        )
    class_path_record(partial).replace(class_path_record(target))
    partial.replace(target)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    target = Path(args[0]) if args else archive_path()
    if target is None:
        logger.error("%s is set empty: no archive to build", ARCHIVE_ENV)
        return 2
    build(target)
    sys.stderr.write(f"JVM class archive: {target} ({target.stat().st_size >> 20} MiB)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
