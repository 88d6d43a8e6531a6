"""Assertion helpers shared by the tests: multiset comparison of rows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from pyspark.sql import DataFrame


def row_multiset(rows: Iterable[Any]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r) for r in rows)


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
