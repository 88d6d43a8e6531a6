"""A small SSBJ pipeline with a quality suite on its output, and defect injection.

The suite file is written to a temporary ``expectations/`` folder, as a team would add one:
no code names it, only the config's ``quality.out.suites``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from joins.ssbj.step import ENTRY_STEP
from pipeline.drivers import StageDrivers
from pipeline.handles import PipelineHandles
from tests.pipeline.ssbj_harness import SsbjHarness
from warehouse.delta import DeltaEngine

OUTPUT_COLUMNS = [
    "id",
    "k",
    "ts",
    "_source_file",
    "_batch_id",
    "_interval_start",
    "mk",
    "supplier",
    "price",
    "_version_m",
]
SUITE = {
    "name": "out_suite",
    "meta": {"notes": "test suite of the harness output"},
    "expectations": [
        {
            "type": "expect_table_columns_to_match_set",
            "kwargs": {"column_set": OUTPUT_COLUMNS, "exact_match": True},
        },
        {
            "type": "expect_column_values_to_be_of_type",
            "kwargs": {"column": "id", "type_": "LongType"},
        },
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "_interval_start"}},
        {
            "type": "expect_compound_columns_to_be_unique",
            "kwargs": {"column_list": ["id", "mk", "supplier"]},
        },
        {
            "type": "unexpected_rows_expectation",
            "kwargs": {
                "unexpected_rows_query": (
                    "SELECT i.tuple_id FROM audit_input i LEFT ANTI JOIN {batch} b "
                    "ON b.id = i.tuple_id LEFT ANTI JOIN audit_pending p ON p.tuple_id = "
                    "i.tuple_id LEFT ANTI JOIN audit_published q ON q.tuple_id = i.tuple_id "
                    "WHERE i.must_emit"
                ),
                "description": "row conservation: a tuple vanished",
            },
        },
        {
            "type": "unexpected_rows_expectation",
            "kwargs": {
                "unexpected_rows_query": (
                    "SELECT p.* FROM audit_pending p LEFT JOIN (SELECT 1 AS present FROM "
                    "{batch} LIMIT 1) b ON true WHERE p.age_steps > p.max_age_steps"
                ),
                "description": "freshness: a tuple waited too long",
            },
        },
    ],
}
MASTER = [(k, s, float(10 * k + s)) for k in range(1, 6) for s in range(k % 3)]


def quality_harness(
    spark: SparkSession,
    root: Path,
    steps: int = 2,
    warn_only: bool = False,
    suites: Sequence[str] = ("out_suite",),
    mode: str = "ssbj",
    operator: dict[str, Any] | None = None,
) -> SsbjHarness:
    expectations = root / "expectations"
    expectations.mkdir(parents=True, exist_ok=True)
    (expectations / "out_suite.json").write_text(json.dumps(SUITE, indent=2))
    extra = {
        "expectations_dir": str(expectations),
        "quality": {
            "out": {
                "suites": list(suites),
                "warn_only": warn_only,
                "value_ranges": {"price": [0, 1000]},
            }
        },
    }
    h = SsbjHarness(spark, root, mode, 2, steps, "left", extra_config=extra, operator=operator)
    if not h.engine.exists(h.master):
        h.load_master(MASTER, files=2)
    # Continue a copied pipeline's arrivals instead of re-sending its batches.
    h.batch_no = h.engine.transaction_version(h.bronze, "test") or 0
    return h


def validate(h: SsbjHarness, run_id: str) -> int:
    return h.context.execute("validate", run_id)


def copy_pipeline(source: Path, target: Path) -> None:
    shutil.copytree(source, target, dirs_exist_ok=True)


class DefectEngine:
    """Delegates to a real engine; rewrites what is appended to, replaced in or written over
    one table (the data is each write's second argument)."""

    _WRITES = frozenset({"append", "overwrite", "replace"})

    def __init__(self, inner: DeltaEngine, path: str, defect: Callable[[DataFrame], DataFrame]):
        self._inner = inner
        self._path = path
        self._defect = defect

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._inner, name)
        if name not in self._WRITES:
            return call

        def write(path: str, data: DataFrame | pa.Table, *args: Any, **kwargs: Any) -> Any:
            if path == self._path:
                data = self._defect(_frame(data))
            return call(path, data, *args, **kwargs)

        return write


def _frame(data: DataFrame | pa.Table) -> DataFrame:
    if not isinstance(data, pa.Table):
        return data
    spark = SparkSession.getActiveSession()
    assert spark is not None
    return spark.createDataFrame(data)


@contextmanager
def defect_in(
    h: SsbjHarness, path: str, defect: Callable[[DataFrame], DataFrame]
) -> Iterator[None]:
    """Stage steps run inside the block write through a :class:`DefectEngine`."""
    real = h.runner.drivers
    defective = DefectEngine(h.engine, path, defect)
    h.runner.drivers = StageDrivers(PipelineHandles(h.config, h.spark, defective, h.store))  # type: ignore[arg-type]
    try:
        yield
    finally:
        h.runner.drivers = real


# --------------------------------------------------------------------------- defects


def duplicate_a_match(rows: DataFrame) -> DataFrame:
    return rows.unionByName(rows.where(F.col("mk").isNotNull()).limit(1))


def drop_tuple(tuple_id: int, column: str = "id") -> Callable[[DataFrame], DataFrame]:
    """Rows without tuple ``tuple_id`` (rows with a null ``column`` are kept: an SSBJ state
    table's master rows)."""
    return lambda rows: rows.where(~F.col(column).eqNullSafe(tuple_id))


def null_key(tuple_id: int) -> Callable[[DataFrame], DataFrame]:
    return lambda rows: rows.withColumn(
        "id", F.when(F.col("id") == tuple_id, F.lit(None)).otherwise(F.col("id"))
    )


def out_of_range_price(rows: DataFrame) -> DataFrame:
    return rows.withColumn(
        "price", F.when(F.col("price").isNotNull(), F.lit(5000.0)).otherwise(F.col("price"))
    )


def stale_entry(rows: DataFrame) -> DataFrame:
    """Pending tuples that claim to have entered 10 steps ago (other state rows: null)."""
    return rows.withColumn(ENTRY_STEP, F.col(ENTRY_STEP) - 10)


def arrive_and_run(h: SsbjHarness, tuples: Sequence[tuple[int, int]], run_id: str) -> None:
    h.arrive(tuples)
    h.run(run_id)


def published_rows(h: SsbjHarness) -> list[tuple[Any, ...]]:
    path = h.layout.published("out")
    if not h.engine.exists(path):
        return []
    return [tuple(r) for r in h.engine.read(path).select(*OUTPUT_COLUMNS).collect()]


def staged_rows(h: SsbjHarness) -> list[tuple[Any, ...]]:
    return [
        tuple(r) for r in h.engine.read(h.layout.staged("out")).select(*OUTPUT_COLUMNS).collect()
    ]


FIRST_BATCH = [(1, 1), (2, 2), (3, 77), (4, 3), (5, 4)]
SECOND_BATCH = [(11, 1), (12, 5), (13, 77), (14, 2)]


def quarantined_second_batch(
    spark: SparkSession,
    base: Path,
    root: Path,
    warn_only: bool = False,
    suites: Sequence[str] = ("out_suite",),
    mode: str = "ssbj",
    operator: dict[str, Any] | None = None,
) -> SsbjHarness:
    """A copy of ``base`` whose second batch (run r2) has out-of-range prices."""
    copy_pipeline(base, root)
    h = quality_harness(spark, root, warn_only=warn_only, suites=suites)
    h.arrive(SECOND_BATCH)
    with defect_in(h, h.layout.staged("out"), out_of_range_price):
        h.run("r2")
    return h


def main(argv: list[str]) -> int:
    """Child process of the crash test: one run of the first batch, then validate."""
    from tests.helpers import TEST_SPARK_CONF
    from warehouse.spark import SparkSettings, build_session

    spark = build_session(SparkSettings(master="local[1]", conf=TEST_SPARK_CONF))
    h = quality_harness(spark, Path(argv[0]))
    arrive_and_run(h, FIRST_BATCH, "r1")
    return validate(h, "r1")


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
