"""The local Python daemon (warehouse/python_daemon.py): pyspark's zips leave the workers'
path only where the installed packages stand in for them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from warehouse.python_daemon import is_spark_zip, without_spark_zips


def test_spark_zips_are_told_from_other_entries() -> None:
    lib = "/opt/spark/python/lib"
    assert is_spark_zip(f"{lib}/pyspark.zip")
    assert is_spark_zip(f"{lib}/py4j-0.10.9.9-src.zip")
    assert not is_spark_zip("/work/enrich-code-0123abcd.zip")  # the project's shipped code
    assert not is_spark_zip("/usr/lib/python311.zip")
    assert not is_spark_zip(f"{lib}/pyspark")


def test_the_zips_leave_only_where_the_packages_import_without_them(tmp_path: Path) -> None:
    zips = [str(tmp_path / "pyspark.zip"), str(tmp_path / "py4j-0.10.9.9-src.zip")]
    installed = [*zips, *sys.path]  # this interpreter has pyspark and py4j installed
    assert without_spark_zips(installed) == sys.path
    assert without_spark_zips(sys.path) is sys.path  # nothing to drop
    bare = [*zips, str(tmp_path)]  # an interpreter with neither: the path stays whole
    assert without_spark_zips(bare) == bare
    assert "pyspark" in sys.modules  # the probe changed nothing it imported


def test_a_local_session_s_python_tasks_run_in_workers_of_the_daemon(
    spark: SparkSession,
) -> None:
    from warehouse.spark import LOCAL_PYTHON_DAEMON, PYTHON_DAEMON, session_conf

    assert spark.sparkContext.getConf().get(PYTHON_DAEMON) == LOCAL_PYTHON_DAEMON
    assert PYTHON_DAEMON not in session_conf({}, "spark://h:7077")

    @F.udf("string")
    def worker_path(_: int) -> str:
        return "|".join(sys.path)

    paths = {r[0] for r in spark.range(4).select(worker_path("id")).collect()}
    assert paths and not any(is_spark_zip(e) for p in paths for e in p.split("|"))


@pytest.mark.parametrize("master", ["local", "local[2]"])
def test_a_caller_s_own_daemon_module_is_kept(master: str) -> None:
    from warehouse.spark import PYTHON_DAEMON, session_conf

    assert session_conf({PYTHON_DAEMON: "my.daemon"}, master)[PYTHON_DAEMON] == "my.daemon"
