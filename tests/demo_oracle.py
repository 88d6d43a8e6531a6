"""DuckDB's answer for the demo pipeline's orders outputs, from the same inputs.

The independent oracle of the demo tests: the masters as read back (rows and version), the
orders files as delivered, joined by SQL (an equi join for ``orders_customer``, a range join
for ``orders_enriched``); compared with the pipeline's tables as whole multisets.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

ENRICHED_COLUMNS = [
    "o_orderkey", "o_custkey", "o_totalprice", "o_orderdate", "event_time", "_interval_start",
    "c_name", "c_nationkey", "c_acctbal", "_version_customer",
    "promo_id", "discount", "_version_promotions",
]  # fmt: skip

ORDERS_COLUMNS = (
    "{o_orderkey: 'BIGINT', o_custkey: 'BIGINT', o_totalprice: 'DOUBLE', o_orderdate: 'DATE', "
    "o_orderpriority: 'VARCHAR', event_time: 'TIMESTAMP'}"
)


def normalise(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value
    if isinstance(value, float):
        return round(value, 6)
    return value


def delta_rows(
    path: str, columns: list[str], storage_options: Mapping[str, str] | None = None
) -> list[tuple]:
    options = dict(storage_options) if storage_options else None
    table = DeltaTable(path, storage_options=options).to_pyarrow_table(columns=columns)
    return [tuple(normalise(r[c]) for c in columns) for r in table.to_pylist()]


def oracle_rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return [tuple(normalise(v) for v in row) for row in con.execute(sql).fetchall()]


def load_orders(con: duckdb.DuckDBPyConnection, json_glob: str) -> int:
    """The orders files as table ``orders``; its row count."""
    con.execute(
        f"CREATE TABLE orders AS SELECT * FROM read_json('{json_glob}', "
        f"format='newline_delimited', columns={ORDERS_COLUMNS})"
    )
    ((count,),) = con.execute("SELECT count(*) FROM orders").fetchall()
    return int(count)


def enriched_orders(
    con: duckdb.DuckDBPyConnection,
    masters: Mapping[str, pa.Table],
    versions: Mapping[str, int],
) -> list[tuple]:
    """``orders_enriched`` (:data:`ENRICHED_COLUMNS`): orders left-joined to customer on the
    key and to promotions on ``valid_from <= o_orderdate < valid_to``, each master's columns
    tagged with the version they came from."""
    for name in ("customer", "promotions"):
        con.register(name, masters[name])
    return oracle_rows(
        con,
        f"""SELECT o.o_orderkey, o.o_custkey, o.o_totalprice, o.o_orderdate, o.event_time,
               time_bucket(INTERVAL 1 HOUR, o.event_time), c.c_name, c.c_nationkey, c.c_acctbal,
               CASE WHEN c.c_custkey IS NULL THEN NULL ELSE {versions["customer"]} END,
               p.promo_id, p.discount,
               CASE WHEN p.promo_id IS NULL THEN NULL ELSE {versions["promotions"]} END
        FROM orders o
        LEFT JOIN customer c ON o.o_custkey = c.c_custkey
        LEFT JOIN promotions p ON o.o_orderdate >= p.valid_from AND o.o_orderdate < p.valid_to""",
    )
