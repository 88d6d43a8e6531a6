"""The plain join of a batch to the whole master, with and without the key prefilter,
against DuckDB on the whole multiset of rows (duplicates, many-to-many, unmatched keys,
null keys, two-column keys)."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from joins.baseline import equi_join_flagged, finish
from pipeline.baseline_driver import PREFILTER_MASTER_BATCHES, prefilters
from tests.helpers import assert_same_multiset

STREAM = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("a", T.LongType()),
        T.StructField("b", T.StringType()),
    ]
)
MASTER = T.StructType(
    [
        T.StructField("ma", T.LongType()),
        T.StructField("mb", T.StringType()),
        T.StructField("price", T.DoubleType()),
    ]
)
# Repeated stream keys and tuples, a key with three master rows, keys with none, a null
# key on each side, and master rows no tuple asks for.
STREAM_ROWS = [(1, 1, "x"), (2, 1, "x"), (2, 1, "x"), (3, 2, "y"), (4, 9, "x"), (5, None, "x")]
MASTER_ROWS = [
    (1, "x", 1.0),
    (1, "x", 2.0),
    (1, "x", 3.0),
    (1, "y", 4.0),
    (2, "y", 5.0),
    (None, "x", 6.0),
    *[(k, "z", float(k)) for k in range(10, 40)],
]


def _oracle(how: str, on: dict[str, str]) -> list[tuple[object, ...]]:
    stream = pa.Table.from_pylist([dict(zip(STREAM.names, r, strict=True)) for r in STREAM_ROWS])
    master = pa.Table.from_pylist([dict(zip(MASTER.names, r, strict=True)) for r in MASTER_ROWS])
    condition = " and ".join(f"s.{s} = m.{m}" for s, m in on.items())
    join = "left join" if how == "left" else "join"
    con = duckdb.connect()
    con.register("s", stream)
    con.register("m", master)
    return con.sql(
        f"select s.id, s.a, s.b, m.ma, m.mb, m.price from s {join} m on {condition}"
    ).fetchall()


@pytest.mark.parametrize("prefilter", [False, True])
@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("on", [{"a": "ma"}, {"a": "ma", "b": "mb"}])
def test_the_prefiltered_join_equals_duckdb(
    spark: SparkSession, prefilter: bool, how: str, on: dict[str, str]
) -> None:
    stream = spark.createDataFrame(STREAM_ROWS, STREAM)
    master = spark.createDataFrame(MASTER_ROWS, MASTER)
    joined = finish(equi_join_flagged(stream, master, on, "m", 3, prefilter=prefilter), how)
    assert {r["_version_m"] for r in joined.collect() if r["ma"] is not None} == {3}
    rows = joined.select("id", "a", "b", "ma", "mb", "price").collect()
    assert_same_multiset(rows, _oracle(how, on))


def test_a_batch_far_smaller_than_the_master_is_prefiltered() -> None:
    assert prefilters(20_000, 800_000)
    assert prefilters(100, PREFILTER_MASTER_BATCHES * 100)
    assert not prefilters(100, PREFILTER_MASTER_BATCHES * 100 - 1)
    assert not prefilters(200_000, 800_000)
    assert not prefilters(None, 800_000) and not prefilters(20_000, None)
