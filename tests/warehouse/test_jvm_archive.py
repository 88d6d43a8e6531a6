"""The Spark driver's class-data-sharing archive: added to the driver's options only when it
exists and nothing else chose CDS, and the archive ``make setup`` built is the one a driver
JVM really maps (its Spark and delta-spark classes load from the shared archive, not from
the jars)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from warehouse.jvm_archive import (
    DRIVER_CLASS_PATH,
    DRIVER_OPTIONS,
    archive_path,
    class_path_record,
    with_class_archive,
)
from warehouse.spark import delta_jars, session_conf


def test_the_archive_joins_the_drivers_options_only_when_it_exists(tmp_path: Path) -> None:
    archive = tmp_path / "a.jsa"
    assert with_class_archive({"x": "1"}, archive) == {"x": "1"}  # no file yet
    assert with_class_archive({"x": "1"}, None) == {"x": "1"}  # turned off
    archive.write_bytes(b"\0")
    assert with_class_archive({}, archive) == {DRIVER_OPTIONS: f"-XX:SharedArchiveFile={archive}"}
    kept = with_class_archive({DRIVER_OPTIONS: "-Dfoo=1"}, archive)
    assert kept[DRIVER_OPTIONS] == f"-Dfoo=1 -XX:SharedArchiveFile={archive}"
    for own in ("-Xshare:off", "-XX:SharedArchiveFile=/x.jsa", "-XX:ArchiveClassesAtExit=/y"):
        assert with_class_archive({DRIVER_OPTIONS: own}, archive) == {DRIVER_OPTIONS: own}


def test_the_archive_is_mapped_only_with_the_class_path_it_was_trained_with(
    tmp_path: Path,
) -> None:
    archive = tmp_path / "a.jsa"
    archive.write_bytes(b"\0")
    class_path_record(archive).write_text("/j/delta.jar:/j/storage.jar")
    same = {DRIVER_CLASS_PATH: "/j/delta.jar:/j/storage.jar"}
    assert with_class_archive(same, archive)[DRIVER_OPTIONS].endswith(f"={archive}")
    for other in ({}, {DRIVER_CLASS_PATH: "/j/delta.jar"}):
        assert DRIVER_OPTIONS not in with_class_archive(other, archive)
    # The archive setup built records its class path: every session's maps it.
    built = archive_path()
    assert built is not None and class_path_record(built).is_file()
    assert DRIVER_OPTIONS in session_conf({}, "local[2]", with_delta=False)


def test_session_settings_leave_delta_spark_off_when_asked() -> None:
    without = session_conf({}, "local[2]", with_delta=False)
    assert "spark.sql.extensions" not in without and "spark.jars" not in without
    assert without["spark.sql.session.timeZone"] == "UTC"  # the required settings stay
    # The class path is every session's, so that one class archive matches every driver.
    assert without[DRIVER_CLASS_PATH] == session_conf({}, "local[2]")[DRIVER_CLASS_PATH]


def test_delta_jars_are_on_the_drivers_class_path_and_shipped_to_executors() -> None:
    jars = delta_jars()
    assert jars, "`make jars` fetches delta-spark"
    conf = session_conf({DRIVER_CLASS_PATH: "/opt/own.jar"}, "spark://h:7077")
    assert conf["spark.jars"].split(",") == jars
    resolved = [str(Path(j).resolve()) for j in jars]
    assert conf[DRIVER_CLASS_PATH].split(os.pathsep) == [*resolved, "/opt/own.jar"]


def loaded_classes(tmp_path: Path, body: str) -> list[str]:
    """The JVM's class-load log lines of a driver that runs ``body`` (``spark`` defined)."""
    archive = archive_path()
    assert archive is not None and archive.is_file(), f"`make setup` builds {archive}"
    log = tmp_path / "classes.log"
    script = (
        "from warehouse.spark import SparkSettings, build_session\n"
        "from warehouse.delta import open_engine\n"
        f"conf = {{{DRIVER_OPTIONS!r}: '-Xlog:class+load=info:file={log}'}}\n"
        f"{body}"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return log.read_text().splitlines()


def assert_from_archive(lines: list[str], package: str, at_least: int) -> None:
    """Most of ``package``'s classes came from the archive, few from jars (lambdas are
    generated at run time, from neither)."""
    classes = [line for line in lines if f" {package}." in line]
    shared = [line for line in classes if "source: shared objects file" in line]
    from_jars = [line for line in classes if re.search(r"source: (jar|file):", line)]
    assert len(shared) > at_least, f"{len(shared)} {package} classes came from the archive"
    # A few that the training run did not touch are still read from the jars.
    assert len(from_jars) < 0.1 * len(shared), (package, len(from_jars), len(shared))


def test_a_driver_without_delta_maps_the_archive_setup_built(tmp_path: Path) -> None:
    """The embedded engine's session (no Delta extension) maps the same archive."""
    lines = loaded_classes(
        tmp_path,
        "spark = build_session(SparkSettings(master='local[1]', conf=conf, delta_jars=False))\n"
        "assert spark.range(5).count() == 5\n",
    )
    assert_from_archive(lines, "org.apache.spark.sql", 1000)
    assert not [line for line in lines if " org.apache.spark.sql.delta." in line]


def test_a_native_delta_driver_loads_delta_spark_from_the_archive(tmp_path: Path) -> None:
    table = str(tmp_path / "t")
    lines = loaded_classes(
        tmp_path,
        "spark = build_session(SparkSettings(master='local[1]', conf=conf))\n"
        "native = open_engine(spark, 'native')\n"
        f"native.create_table({table!r}, spark.range(5).schema)\n"
        f"native.append({table!r}, spark.range(5))\n"
        f"assert native.read({table!r}).count() == 5\n",
    )
    assert_from_archive(lines, "org.apache.spark.sql", 1000)
    assert_from_archive(lines, "org.apache.spark.sql.delta", 500)
