"""delta-spark's JVM side, as the native engine reaches it through py4j.

Where delta-spark's Python API has no call, the native engine uses its JVM ``DeltaLog`` and
``Snapshot`` directly (of the jar version the Makefile pins); this is that access: the log
and a snapshot of a table, Scala collections as Python lists, and the errors the JVM raises.
Every other part of the engine builds on it.
"""

from __future__ import annotations

from typing import Any

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame

from common.errors import ConfigError, DeltaTableError, TableNotFoundError
from warehouse.delta.engine import DeltaEngine

# What delta-spark and Spark raise through py4j: JVM errors, converted or not.
JVM_ERRORS: tuple[type[Exception], ...] = (PySparkException, Py4JError)


class NativeJvm(DeltaEngine[Any]):
    """The JVM access the native engine's parts share (the bottom of its layers)."""

    # delta-spark's Python DeltaTable class (imported with the engine, which checks the jars).
    _tables: Any

    @property
    def _jvm(self) -> Any:
        jvm = self._spark._jvm
        if jvm is None:  # pragma: no cover - a classic session always has one
            raise ConfigError("the native Delta engine needs a classic (py4j) Spark session")
        return jvm

    def _none(self) -> Any:
        return self._jvm.scala.Option.empty()

    def _java_list(self, seq: Any) -> list[Any]:
        return list(self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))

    def _scala_seq(self, items: Any) -> Any:
        """A Scala immutable Seq of a Java list."""
        return self._jvm.scala.jdk.javaapi.CollectionConverters.asScala(items).toList()

    def _log(self, root: str) -> Any:
        return self._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
            self._spark._jsparkSession, root
        )

    def _jsnapshot(self, root: str, version: int | None = None) -> Any:
        """delta-spark's Snapshot of the latest version, or of ``version``."""
        log = self._log(root)
        try:
            latest = log.update(False, self._none(), self._none())
        except JVM_ERRORS as e:
            raise DeltaTableError(f"cannot open Delta table {root}: {jvm_message(e)}") from e
        if latest.version() < 0:
            raise TableNotFoundError(f"no Delta table at {root}")
        if version is None or version == latest.version():
            return latest
        if version < 0 or version > latest.version():
            raise DeltaTableError(
                f"Delta table {root} has versions 0..{latest.version()}; version {version} "
                "was asked for"
            )
        try:
            return log.getSnapshotAt(version, self._none(), self._none(), False)
        except JVM_ERRORS as e:
            raise DeltaTableError(
                f"cannot load version {version} of Delta table {root}: {jvm_message(e)}"
            ) from e

    def _frame(self, jdf: Any) -> DataFrame:
        return DataFrame(jdf, self._spark)


def jvm_message(error: BaseException) -> str:
    """The first line of a JVM error (its stack trace stays on the exception chain)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
