"""A step's keyed rows laid out in the driver (WideTable.keyed_rows_arrow) are the rows
Spark lays out (WideTable.keyed_rows without the semi-join): same roles, values, key
hashes and bucket labels, as a multiset."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from joins.skew.key_routing import KeyRouting
from joins.ssbj.roles import CACHE, ENTRY_STEP, PENDING, ROLE, master_field, stream_field
from joins.ssbj.step import INPUT_VERSION, JoinSpec
from joins.ssbj.wide_table import WideTable
from tests.helpers import assert_same_multiset

UTC = dt.UTC
STREAM = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("k", T.IntegerType(), True),
        T.StructField("event_time", T.TimestampType(), True),
        T.StructField(INPUT_VERSION, T.LongType(), True),
    ]
)
MASTER = T.StructType(
    [
        T.StructField("mk", T.LongType(), True),
        T.StructField("name", T.StringType(), True),
        T.StructField("price", T.DoubleType(), True),
    ]
)
SPEC = JoinSpec(("k",), ("mk",), ("mk", "name", "price"), "m", "left")
WIDE = WideTable.of(SPEC, STREAM, MASTER)

T0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
NEW_ROWS = [(1, 7, T0, 3), (2, None, T0, 3), (3, -5, None, 4), (4, 2**31 - 1, T0, 4)]
MASTER_ROWS = [(7, "seven", 1.5), (None, "none", 0.0), (-5, "minus", -0.0), (8, None, None)]


def new_rows_arrow() -> pa.Table:
    """NEW_ROWS as the driver reads them (the stream's Arrow types)."""
    return pa.Table.from_pylist(
        [dict(zip(STREAM.fieldNames(), row, strict=True)) for row in NEW_ROWS],
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("k", pa.int32()),
                ("event_time", pa.timestamp("us", tz="UTC")),
                (INPUT_VERSION, pa.int64()),
            ]
        ),
    )


def rows_of(table: pa.Table) -> list[tuple[object, ...]]:
    return list(zip(*(c.to_pylist() for c in table.columns), strict=True))


def state_table() -> pa.Table:
    """H_S and H_R rows as a state table holds them (a subset of the wide columns)."""
    return pa.table(
        {
            ROLE: pa.array([PENDING, CACHE, CACHE], pa.string()),
            stream_field("id"): pa.array([9, None, None], pa.int64()),
            stream_field("k"): pa.array([8, None, None], pa.int32()),
            stream_field("event_time"): pa.array([T0, None, None], pa.timestamp("us", tz="UTC")),
            stream_field(INPUT_VERSION): pa.array([2, None, None], pa.int64()),
            master_field("mk"): pa.array([None, 7, 2**40], pa.int64()),
            master_field("name"): pa.array([None, "seven", "big"], pa.string()),
            master_field("price"): pa.array([None, 1.5, 2.0], pa.float64()),
            ENTRY_STEP: pa.array([1, None, None], pa.int64()),
        }
    )


@pytest.mark.parametrize(
    "routing",
    [KeyRouting(4), KeyRouting(3), None],
    ids=["home", "three-buckets", "moved"],
)
def test_driver_keyed_rows_equal_sparks(spark: SparkSession, routing: KeyRouting | None) -> None:
    new = spark.createDataFrame(NEW_ROWS, STREAM)
    master = spark.createDataFrame(MASTER_ROWS, MASTER)
    state = spark.createDataFrame(state_table())
    if routing is None:  # key 7's hash moved away from its home bucket
        key = new.where("k = 7").select("k").selectExpr("xxhash64(CAST(k AS BIGINT))").first()
        assert key is not None
        home = KeyRouting(4).home(key[0])
        routing = KeyRouting(4, moved=((key[0], (home + 1) % 4),))
    spark_rows = WIDE.keyed_rows(
        [WIDE.stream_rows(new), WIDE.state_rows(state)],
        [WIDE.partition_rows(master, 5)],
        routing,
        semi_join=False,
    ).toArrow()
    arrow_new = new_rows_arrow()
    arrow_master = pa.Table.from_pylist(
        [dict(zip(MASTER.fieldNames(), row, strict=True)) for row in MASTER_ROWS]
    )
    driver_rows = WIDE.keyed_rows_arrow(
        [WIDE.stream_rows(arrow_new), WIDE.state_rows(state_table())],
        [WIDE.partition_rows(arrow_master, 5)],
        routing,
    )
    assert driver_rows.schema.names == spark_rows.schema.names
    assert driver_rows.num_rows == len(NEW_ROWS) + 3 + len(MASTER_ROWS)
    assert_same_multiset(rows_of(driver_rows), rows_of(spark_rows))


def test_keys_the_driver_cannot_hash_as_spark_does_are_left_to_spark() -> None:
    assert WIDE.arrow_keys_supported()
    by_string = WideTable.of(
        JoinSpec(("k",), ("name",), ("mk", "name"), "m", "inner"),
        T.StructType([T.StructField("k", T.StringType())]),
        MASTER,
    )
    assert not by_string.arrow_keys_supported()
    narrowing = WideTable.of(
        JoinSpec(("k",), ("mk",), ("mk",), "m", "inner"),
        T.StructType([T.StructField("k", T.DoubleType())]),
        MASTER,
    )
    assert not narrowing.arrow_keys_supported()
    with pytest.raises(ValueError, match="split keys"):
        WIDE.keyed_rows_arrow([], [], KeyRouting(2, split=((1, (0,)),)))


def test_asked_keys_keep_every_master_row_a_tuple_or_pending_tuple_asks_for() -> None:
    """New tuples ask for 7, -5 and 2^31-1 (a null key asks for nothing), the pending one
    for 8; cache rows ask for nothing. The filter keeps exactly the master rows of those
    keys, and the asked range bounds which files may hold them."""
    arrow_new = new_rows_arrow()
    asked = WIDE.asked_keys([WIDE.stream_rows(arrow_new), WIDE.state_rows(state_table())])
    assert asked is not None
    master = pa.table({"mk": pa.array([7, 7, 8, 9, -5, None, 2**31 - 1, 2**40], pa.int64())})
    kept = master.filter(asked.row_mask(master)).column("mk").to_pylist()
    assert sorted(kept) == [-5, 7, 7, 8, 2**31 - 1]
    assert asked.bounds() == {"mk": (-5, 2**31 - 1)}
    nothing = WIDE.asked_keys([WIDE.state_rows(state_table().slice(1))])
    assert nothing is not None and nothing.bounds() == {"mk": None}


def test_floating_keys_are_not_filtered_by_value() -> None:
    floating = WideTable.of(
        JoinSpec(("p",), ("price",), ("price",), "m", "inner"),
        T.StructType([T.StructField("p", T.DoubleType())]),
        MASTER,
    )
    rows = floating.stream_rows(pa.table({"p": pa.array([0.0], pa.float64())}))
    assert floating.asked_keys([rows]) is None
