"""The Python daemon a local Spark forks its Python workers from, without pyspark's zips.

Spark starts ``python -m <daemon module> pyspark.worker`` with ``$SPARK_HOME/python/lib/
pyspark.zip`` and py4j's zip first on ``PYTHONPATH``; a pip-installed pyspark ships both
beside its own package. Every task a reused worker runs begins with
``importlib.invalidate_caches()`` (``pyspark.worker_util.setup_spark_files``), and on
Python 3.11 that makes each zip importer on ``sys.path`` read its zip's whole directory
again: 1,328 entries for pyspark.zip. Measured with py-spy on the two Python workers of
``tests/joins/theta/test_join.py`` (A-DSP's ``applyInArrow`` tasks): 2,527 of 3,777
samples were that re-read, 70 the join's own work; the workers were 32 of the run's
70.6 CPU s.

This module removes those zips from ``sys.path`` when the same interpreter imports
``pyspark`` and ``py4j`` without them (the installed packages, the same release as the
zips), then runs pyspark's own daemon (which reads the worker module from ``sys.argv``).
Where it cannot (an interpreter without pyspark installed) the path stays as Spark made it.

``warehouse.spark`` names it in ``spark.python.daemon.module`` for local masters only: a
cluster's executors may not have this package before the driver ships it.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import PathFinder

# The zips Spark puts on a Python worker's path (PythonUtils.sparkPythonPath).
SPARK_ZIPS = ("pyspark.zip", "py4j-")


def is_spark_zip(entry: str) -> bool:
    name = os.path.basename(entry)
    return name.endswith(".zip") and name.startswith(SPARK_ZIPS)


def without_spark_zips(path: list[str]) -> list[str]:
    """``path`` without Spark's pyspark and py4j zips, if the interpreter imports both
    packages without them; else ``path`` unchanged."""
    kept = [entry for entry in path if not is_spark_zip(entry)]
    if len(kept) == len(path):
        return path
    # PathFinder searches exactly these entries: neither sys.path nor sys.modules.
    found = all(PathFinder.find_spec(name, kept) is not None for name in ("pyspark", "py4j"))
    return kept if found else path


def main() -> None:
    sys.path[:] = without_spark_zips(sys.path)
    # Imported only now, from the path chosen above; its module code reads sys.argv.
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
