"""Delta file statistics from Parquet footers: bounds that hold, checked against DuckDB.

Every bound is compared with DuckDB's own aggregate over the same Parquet file, then a
table written by the embedded engine is read back by delta-rs (the stats it parses) and by
delta-spark, whose data skipping would drop rows if a bound were wrong.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.delta.file_stats import STRING_PREFIX, delta_stats_json

UTC = dt.UTC
MILLI = dt.timedelta(milliseconds=1)


def strict_json(text: str) -> dict[str, Any]:
    def refuse(constant: str) -> None:
        raise AssertionError(f"stats hold {constant}, which is not JSON")

    return json.loads(text, parse_constant=refuse, parse_float=decimal.Decimal)


def logged_adds(path: str) -> list[dict[str, Any]]:
    """Every add action of the table's commit files, in commit order."""
    return [
        json.loads(line)["add"]
        for log in sorted((Path(path) / "_delta_log").glob("*.json"))
        for line in log.read_text().splitlines()
        if '"add"' in line
    ]


def duckdb_truth(path: Path, column: str) -> tuple[Any, Any, int, int]:
    query = (
        f'SELECT min("{column}"), max("{column}"), count(*) - count("{column}"), count(*) '
        f"FROM read_parquet('{path}')"
    )
    with duckdb.connect() as con:
        con.execute("SET TimeZone = 'UTC'")
        row = con.execute(query).fetchone()
    assert row is not None
    return row[0], row[1], int(row[2]), int(row[3])


def as_utc(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def check_bounds(path: Path, stats: dict[str, Any], column: str, kind: str) -> None:
    low, high, nulls, rows = duckdb_truth(path, column)
    assert stats["numRecords"] == rows
    assert stats["nullCount"][column] == nulls
    mins, maxes = stats.get("minValues", {}), stats.get("maxValues", {})
    if low is None:  # every value null: nothing to bound
        assert column not in mins and column not in maxes
        return
    if kind == "string":
        assert low.startswith(mins[column]) and len(mins[column]) <= STRING_PREFIX
        if len(high) <= STRING_PREFIX:
            assert maxes[column] == high
        else:
            assert column not in maxes
    elif kind == "timestamp":
        low_bound, high_bound = as_utc(mins[column]), as_utc(maxes[column])
        assert low_bound <= low < low_bound + MILLI
        assert high_bound - MILLI < high <= high_bound
    elif kind == "double":  # NaN is not in Parquet's bounds but is Spark's largest value
        assert column not in mins and column not in maxes
    else:
        assert mins[column] == low and maxes[column] == high


NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
TIMES = st.datetimes(
    min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2100, 1, 1), timezones=st.just(UTC)
)
PRICES = st.decimals(min_value=-(10**6), max_value=10**6, places=2)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.none() | st.integers(-(2**62), 2**62),
            st.none() | NAMES,
            st.none() | TIMES,
            st.none() | PRICES,
            st.none() | st.floats(allow_nan=True, allow_infinity=True),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 7),
)
def test_every_bound_holds_for_every_row_of_the_file(
    rows: list[tuple[Any, ...]], row_group_size: int
) -> None:
    table = pa.table(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "name": pa.array([r[1] for r in rows], pa.string()),
            "at": pa.array([r[2] for r in rows], pa.timestamp("us", tz="UTC")),
            "price": pa.array([r[3] for r in rows], pa.decimal128(12, 2)),
            "score": pa.array([r[4] for r in rows], pa.float64()),
        }
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "part.parquet"
        pq.write_table(table, path, row_group_size=row_group_size)
        stats = strict_json(delta_stats_json(pq.read_metadata(path)))
        for column, kind in (
            ("id", "long"),
            ("name", "string"),
            ("at", "timestamp"),
            ("price", "decimal"),
            ("score", "double"),
        ):
            check_bounds(path, stats, column, kind)


SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), False),
        T.StructField("name", T.StringType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("price", T.DecimalType(12, 2)),
        T.StructField("tags", T.StructType([T.StructField("x", T.LongType())])),
    ]
)


@pytest.fixture
def engine(spark: SparkSession) -> EmbeddedDeltaEngine:
    return EmbeddedDeltaEngine(spark)


def test_the_embedded_engine_writes_stats_other_delta_readers_use(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    engine.create_table(path, SCHEMA)
    base = dt.datetime(2024, 1, 1, tzinfo=UTC)
    written: list[tuple[Any, ...]] = []
    for batch in range(3):  # disjoint id ranges: one file per batch
        rows = [
            (
                batch * 100 + i,
                None if i == 3 else f"n{batch}-{i}",
                base + dt.timedelta(hours=batch, microseconds=i * 1500),
                decimal.Decimal(f"{batch}.{i:02d}"),
                {"x": i},
            )
            for i in range(10)
        ]
        written.extend(rows)
        engine.append(path, spark.createDataFrame(rows, SCHEMA).coalesce(1))
    # delta-rs parses the stats: one row per file with min/max/null counts per column.
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    assert len(adds) == 3
    for add in adds:
        file = Path(path) / add["path"]
        stats = strict_json(
            json.dumps(
                {
                    "numRecords": add["num_records"],
                    "nullCount": {c: add[f"null_count.{c}"] for c in ("id", "name", "price")},
                    "minValues": {"id": add["min.id"], "price": add["min.price"]},
                    "maxValues": {"id": add["max.id"], "price": add["max.price"]},
                },
                default=str,
            )
        )
        stats["minValues"]["price"] = decimal.Decimal(str(stats["minValues"]["price"]))
        stats["maxValues"]["price"] = decimal.Decimal(str(stats["maxValues"]["price"]))
        check_bounds(file, stats, "id", "long")
        check_bounds(file, stats, "price", "decimal")
        assert add["min.at"] <= duckdb_truth(file, "at")[0]
    # delta-spark skips files by these stats: a wrong bound would lose rows here.
    frame = spark.read.format("delta").load(path)
    cut = base + dt.timedelta(hours=2)
    for predicate, keep in (
        ("id BETWEEN 105 AND 205", lambda r: 105 <= r[0] <= 205),
        ("price > 1.05", lambda r: r[3] > decimal.Decimal("1.05")),
        (f"at >= '{cut.isoformat()}'", lambda r: r[2] >= cut),
        ("name = 'n1-3'", lambda r: r[1] == "n1-3"),
        ("name IS NULL", lambda r: r[1] is None),
    ):
        expected = sum(1 for r in written if keep(r))
        assert frame.where(predicate).count() == expected, predicate


def test_arrow_writes_take_stats_from_the_writer_and_dictionary_encode_only_text(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    # The driver's Parquet writer hands its footer to the add action (no second read of
    # the file): the stats must be the file's own, and delta-rs must read them so.
    path = str(tmp_path / "t")
    rows = pa.table(
        {
            "id": pa.array([3, 1, None, 7], pa.int64()),
            "segment": pa.array(["b", "a", "b", None], pa.string()),
            "price": pa.array([1.5, None, 2.5, 0.5], pa.float64()),
            "day": pa.array([1, 1, 1, 1], pa.int32()),
        }
    )
    engine.append(path, rows, partition_by=["day"])
    (add,) = logged_adds(path)
    file = Path(path) / add["path"]
    assert add["stats"] == delta_stats_json(pq.read_metadata(file))
    stats = strict_json(add["stats"])
    check_bounds(file, stats, "id", "long")
    check_bounds(file, stats, "segment", "string")
    footer = pq.read_metadata(file)
    encodings = {
        footer.schema.column(i).name: footer.row_group(0).column(i).encodings
        for i in range(footer.num_columns)
    }
    assert "RLE_DICTIONARY" in encodings["segment"]
    assert "RLE_DICTIONARY" not in encodings["id"]
    assert "RLE_DICTIONARY" not in encodings["price"]
    assert (
        DeltaTable(path)
        .to_pyarrow_table()
        .sort_by("id")
        .equals(
            rows.sort_by("id").select(["id", "segment", "price", "day"]),
            check_metadata=False,
        )
    )


def test_arrow_writes_leave_out_all_null_columns_and_every_reader_reads_them_as_nulls(
    spark: SparkSession, engine: EmbeddedDeltaEngine, tmp_path: Path
) -> None:
    # A state table's rows each use a few of its columns: a file whose rows leave a
    # nullable column empty does not store it. Delta readers read a column a file lacks
    # as nulls; the embedded engine, delta-rs and delta-spark must all give the rows back.
    path = str(tmp_path / "t")
    first = pa.table(
        {
            "role": pa.array(["counter", "counter"], pa.string()),
            "key": pa.array([4, 9], pa.int64()),
            "name": pa.array([None, None], pa.string()),
            "hits": pa.array([2, None], pa.int64()),
            "seg": pa.array([-2, -2], pa.int64()),
        }
    )
    second = pa.table(
        {
            "role": pa.array(["pending"], pa.string()),
            "key": pa.array([None], pa.int64()),
            "name": pa.array(["x"], pa.string()),
            "hits": pa.array([None], pa.int64()),
            "seg": pa.array([7], pa.int64()),
        }
    )
    engine.append(path, first, partition_by=["seg"])
    engine.append(path, second, partition_by=["seg"])
    files = {add["partitionValues"]["seg"]: add for add in logged_adds(path)}
    stored = {seg: pq.read_schema(Path(path) / add["path"]).names for seg, add in files.items()}
    assert stored == {"-2": ["role", "key", "hits"], "7": ["role", "name"]}
    assert set(strict_json(files["7"]["stats"])["nullCount"]) == {"role", "name"}
    expected = sorted(
        [*first.to_pylist(), *second.to_pylist()], key=lambda r: (r["seg"], r["role"])
    )

    def ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(
            [{c: r[c] for c in first.column_names} for r in rows],
            key=lambda r: (r["seg"], r["role"]),
        )

    snapshot = engine.snapshot(path)
    assert ordered(engine.read_arrow(snapshot).to_pylist()) == expected
    assert ordered(DeltaTable(path).to_pyarrow_table().to_pylist()) == expected
    spark_rows = spark.read.format("delta").load(path).collect()
    assert ordered([r.asDict() for r in spark_rows]) == expected
