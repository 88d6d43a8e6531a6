"""Demo data from TPC-H: Delta master tables and micro-batch stream files.

Masters:
- ``customer`` keyed by ``c_custkey`` (each order matches exactly one customer);
- ``partsupp`` keyed by ``ps_partkey`` (four suppliers per part: many-to-many);
- ``promotions``: promotions valid over date ranges, overlapping, for range enrichment.

Streams: ``orders`` and ``lineitem`` split into JSON-lines micro-batch files per scheduling
interval, with event times inside the interval. The join key can be re-sampled from a Zipf
distribution of skew ``z`` (z = 0 is uniform) to produce hot keys.

Files are written to an outbox and *delivered* into a landing directory by an atomic
rename, the way a real producer must place them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from warehouse.object_store import ObjectLocation, ObjectStore, is_object_store

logger = logging.getLogger(__name__)

TPCH_TABLES = ("customer", "orders", "partsupp", "lineitem")


@dataclass(frozen=True)
class DemoSpec:
    """What to generate: scale factor, how many intervals and files, and key skew."""

    scale: float = 0.01
    intervals: int = 3
    files_per_interval: int = 2
    first_interval: datetime = datetime(2024, 1, 1)
    interval: timedelta = timedelta(hours=1)
    zipf_z: float = 0.0
    seed: int = 7
    lineitem_fraction: float = 0.25


def generate_tpch(scale: float, target: Path, tables: Sequence[str] = TPCH_TABLES) -> Path:
    """Run ``tpchgen-cli`` once per scale factor and table; reuse its Parquet files afterwards.

    ``tables`` limits the generation (SF30's lineitem alone is 180M rows): a table already
    generated, by this call or an earlier one, is not generated again.
    """
    folder = target / f"tpch-sf{scale:g}"
    if (folder / "_complete").exists():  # every table of TPCH_TABLES, from an older layout
        return folder
    missing = [t for t in tables if not (folder / f"_complete-{t}").exists()]
    if not missing:
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    binary = Path(sys.executable).with_name("tpchgen-cli")
    command = [
        str(binary if binary.exists() else "tpchgen-cli"),
        "parquet",
        "-s",
        f"{scale:g}",
        f"--tables={','.join(missing)}",
        f"--output-dir={folder}",
    ]
    logger.info("generating TPC-H SF%s with %s", scale, " ".join(command))
    subprocess.run(command, check=True, capture_output=True)
    for table in missing:
        (folder / f"_complete-{table}").touch()
    return folder


def _plain(table: pa.Table) -> pa.Table:
    """Cast view and decimal types to what every engine (Spark, DuckDB, delta-rs) reads."""
    fields = []
    for f in table.schema:
        if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type):
            fields.append(pa.field(f.name, pa.string()))
        elif pa.types.is_decimal(f.type):
            fields.append(pa.field(f.name, pa.float64()))
        elif pa.types.is_integer(f.type):
            fields.append(pa.field(f.name, pa.int64()))
        else:
            fields.append(pa.field(f.name, f.type))
    return table.cast(pa.schema(fields))


def master_tables(tpch: Path, seed: int) -> dict[str, pa.Table]:
    """The demo masters as Arrow tables, projected and typed."""
    customer = _plain(pq.read_table(tpch / "customer.parquet")).select(
        ["c_custkey", "c_name", "c_nationkey", "c_mktsegment", "c_acctbal"]
    )
    partsupp = _plain(pq.read_table(tpch / "partsupp.parquet")).select(
        ["ps_partkey", "ps_suppkey", "ps_availqty", "ps_supplycost"]
    )
    return {"customer": customer, "partsupp": partsupp, "promotions": promotions(seed)}


def promotions(seed: int, count: int = 240) -> pa.Table:
    """Overlapping promotions valid over [valid_from, valid_to) within TPC-H's order dates."""
    rng = np.random.default_rng(seed)
    first, last = date(1992, 1, 1), date(1998, 8, 2)
    span = (last - first).days
    starts = rng.integers(0, span, size=count)
    lengths = rng.integers(7, 120, size=count)
    return pa.table(
        {
            "promo_id": pa.array(np.arange(1, count + 1), pa.int64()),
            "promo_name": pa.array([f"PROMO-{i:04d}" for i in range(1, count + 1)]),
            "valid_from": pa.array([first + timedelta(days=int(s)) for s in starts], pa.date32()),
            "valid_to": pa.array(
                [first + timedelta(days=int(s + n)) for s, n in zip(starts, lengths, strict=True)],
                pa.date32(),
            ),
            "discount": pa.array(np.round(rng.uniform(0.01, 0.3, size=count), 3), pa.float64()),
        }
    )


def zipf_resample(
    keys: np.ndarray, domain: np.ndarray, z: float, rng: np.random.Generator
) -> np.ndarray:
    """Replace ``keys`` by draws from ``domain`` with P(rank r) proportional to 1 / r**z.

    Ranks are assigned to a random permutation of the domain, so hot keys are spread over
    the key range rather than being the smallest keys. One call fixes one ranking; use
    :class:`ZipfSampler` to draw several batches with the same hot keys.
    """
    if z <= 0:
        return keys
    return ZipfSampler(domain, z, rng).draw(len(keys))


class ZipfSampler:
    """Draws keys from ``domain`` with Zipf skew ``z`` over one fixed ranking of the keys."""

    def __init__(self, domain: np.ndarray, z: float, rng: np.random.Generator) -> None:
        self._rng = rng
        self._domain = rng.permutation(domain)
        weights = 1.0 / np.arange(1, len(domain) + 1, dtype=float) ** max(z, 0.0)
        self._p = weights / weights.sum()

    @property
    def ranked_keys(self) -> np.ndarray:
        """The domain in rank order: ``ranked_keys[r]`` is drawn with ``probabilities[r]``."""
        return self._domain

    @property
    def probabilities(self) -> np.ndarray:
        return self._p

    def draw(self, size: int) -> np.ndarray:
        return self._domain[self._rng.choice(len(self._domain), size=size, p=self._p)]


def stream_batches(tpch: Path, spec: DemoSpec) -> dict[str, list[list[dict[str, object]]]]:
    """Rows of each stream per interval, with event times inside their interval."""
    rng = np.random.default_rng(spec.seed)
    orders = _plain(pq.read_table(tpch / "orders.parquet"))
    customers = pq.read_table(tpch / "customer.parquet", columns=["c_custkey"])
    custkeys = customers.column("c_custkey").to_numpy()
    orders = orders.set_column(
        orders.schema.get_field_index("o_custkey"),
        "o_custkey",
        pa.array(zipf_resample(orders.column("o_custkey").to_numpy(), custkeys, spec.zipf_z, rng)),
    )
    lineitem = _plain(pq.read_table(tpch / "lineitem.parquet"))
    keep = rng.random(lineitem.num_rows) < spec.lineitem_fraction
    lineitem = lineitem.filter(pa.array(keep))
    partkeys = np.unique(
        pq.read_table(tpch / "partsupp.parquet", columns=["ps_partkey"]).column(0).to_numpy()
    )
    lineitem = lineitem.set_column(
        lineitem.schema.get_field_index("l_partkey"),
        "l_partkey",
        pa.array(
            zipf_resample(lineitem.column("l_partkey").to_numpy(), partkeys, spec.zipf_z, rng)
        ),
    )
    lineitem = lineitem.append_column(
        "l_id",
        pc.add(
            pc.multiply(lineitem.column("l_orderkey"), pa.scalar(10, pa.int64())),
            lineitem.column("l_linenumber"),
        ),
    )
    streams = {
        "orders": orders.select(
            ["o_orderkey", "o_custkey", "o_totalprice", "o_orderdate", "o_orderpriority"]
        ),
        "lineitem": lineitem.select(
            ["l_id", "l_orderkey", "l_partkey", "l_quantity", "l_extendedprice"]
        ),
    }
    result: dict[str, list[list[dict[str, object]]]] = {}
    for name, table in streams.items():
        rows = table.to_pylist()
        chunks = np.array_split(np.arange(len(rows)), spec.intervals)
        per_interval = []
        for index, chunk in enumerate(chunks):
            start = spec.first_interval + index * spec.interval
            offsets = np.sort(rng.uniform(0, spec.interval.total_seconds(), size=len(chunk)))
            batch = []
            for position, offset in zip(chunk, offsets, strict=True):
                row = dict(rows[int(position)])
                row["event_time"] = (start + timedelta(seconds=float(offset))).strftime(
                    "%Y-%m-%dT%H:%M:%S.%fZ"
                )
                batch.append(row)
            per_interval.append(batch)
        result[name] = per_interval
    return result


def write_outbox(
    batches: dict[str, list[list[dict[str, object]]]], outbox: Path, files_per_interval: int
) -> None:
    """Write each interval's rows as JSON-lines files under ``outbox/<stream>/<interval>/``."""
    for stream, intervals in batches.items():
        for index, rows in enumerate(intervals):
            folder = outbox / stream / f"{index:04d}"
            folder.mkdir(parents=True, exist_ok=True)
            for part, chunk in enumerate(np.array_split(np.arange(len(rows)), files_per_interval)):
                with (folder / f"{stream}-{index:04d}-{part:02d}.json").open("w") as handle:
                    for position in chunk:
                        handle.write(json.dumps(rows[int(position)], default=str) + "\n")


def deliver(outbox: Path, stream: str, interval_index: int, landing: str | Path) -> list[str]:
    """Place one interval's files into the landing zone atomically: a temporary name, then a
    rename; in an object store one PUT each (an object appears whole or not at all)."""
    source = outbox / stream / f"{interval_index:04d}"
    if is_object_store(str(landing)):
        return _put_objects(sorted(source.glob("*.json")), str(landing))
    landing = Path(landing)
    landing.mkdir(parents=True, exist_ok=True)
    delivered = []
    for path in sorted(source.glob("*.json")):
        in_progress = landing / f"_{path.name}.tmp"
        shutil.copyfile(path, in_progress)
        final = landing / path.name
        os.replace(in_progress, final)
        delivered.append(str(final))
    return delivered


def _put_objects(paths: Sequence[Path], landing: str) -> list[str]:
    prefix = ObjectLocation.parse(landing)
    client = ObjectStore.from_environment().client()
    delivered = []
    for path in paths:
        key = f"{prefix.key.rstrip('/')}/{path.name}".lstrip("/")
        client.put_object(Bucket=prefix.bucket, Key=key, Body=path.read_bytes())
        delivered.append(ObjectLocation(prefix.bucket, key).url())
    return delivered


def interval_starts(spec: DemoSpec) -> Sequence[datetime]:
    return [spec.first_interval + i * spec.interval for i in range(spec.intervals)]
