"""Helpers shared by the tests: multiset comparison of rows, tiny pipeline configs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

# Settings of every Spark session the tests start, in-process or in a child process. Test
# tables hold tens of rows: compiling generated code for every new query plan costs more
# than evaluating it interpreted (two SSBJ stage tests: 90 s with codegen, 78 s without),
# and adaptive execution only adds planning work. Production sessions keep both.
TEST_SPARK_CONF = {
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


NAN = float("nan")


def row_multiset(rows: Iterable[Any]) -> Counter[tuple[Any, ...]]:
    """Rows as a multiset; every NaN is one object, so NaN cells compare equal (as NaN join
    values do in Spark and DuckDB) where Python would compare each NaN unequal."""
    return Counter(tuple(NAN if v != v else v for v in r) for r in rows)


def assert_same_multiset(actual: DataFrame | Iterable[Any], expected: Iterable[Any]) -> None:
    """Fail unless both sides hold the same rows with the same multiplicities."""
    actual_rows = actual.collect() if isinstance(actual, DataFrame) else list(actual)
    got, want = row_multiset(actual_rows), row_multiset(expected)
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"row multisets differ: {sum(missing.values())} missing, {sum(extra.values())} extra\n"
        f"missing (first 5): {list(missing.items())[:5]}\n"
        f"extra (first 5): {list(extra.items())[:5]}"
    )


def tiny_pipeline(root: Path, key: str, key_type: str) -> dict[str, Any]:
    """Config keys of a one-stream pipeline: stream ``s`` of (id, ``key``, ts) under ``root``."""
    return {
        "name": "t",
        "warehouse": {
            "root": str(root / "wh"),
            "state_store": f"sqlite:///{root / 'state.db'}",
            # The tests' Spark session carries the delta-spark jars, so `auto` would pick
            # native; pipeline tests run on the embedded engine unless they say otherwise.
            "engine": "embedded",
        },
        "streams": {
            "s": json_stream(
                str(root / "landing"),
                ["id bigint not null", f"{key} {key_type}", "ts timestamp not null"],
            )
        },
    }


def json_stream(
    landing: str, columns: list[str], event_time: str = "ts", id_column: str = "id"
) -> dict[str, Any]:
    """Config keys of a stream of JSON files landing at ``landing``."""
    return {
        "landing": landing,
        "format": "json",
        "event_time": event_time,
        "id_column": id_column,
        "columns": columns,
    }


def equi_stage(**keys: Any) -> dict[str, Any]:
    """Config keys of equi stage ``enrich`` of :func:`tiny_pipeline`'s stream ``s`` with
    master ``m`` on ``k = mk`` into ``out``; ``keys`` replace or add keys."""
    return {
        "name": "enrich",
        "kind": "equi",
        "input": "s",
        "master": "m",
        "join_on": {"k": "mk"},
        "output": "out",
    } | keys


def assert_imports_none_of(code: str, packages: Iterable[str], cwd: Path) -> None:
    """Run ``code`` in a fresh interpreter and fail if it imported any of ``packages``."""
    probe = (
        "import sys\n"
        f"{code}\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {tuple(packages)!r})\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def kill_harness_at(
    module: str, folder: Path, crash_at: str, cwd: Path, args: Sequence[str] = ()
) -> None:
    """Run ``python -m <module> <folder> <args>`` with the crash point ``crash_at`` armed
    (``common.faults``) and check that it was killed there, not that it ended otherwise."""
    from common.faults import CRASH_ENV_VAR

    killed = subprocess.run(
        [sys.executable, "-m", module, str(folder), *args],
        cwd=cwd,
        env={**os.environ, CRASH_ENV_VAR: crash_at},
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
