"""The demo pipeline with its warehouse and landing zone in an object store (a real S3
server on loopback).

The demo config trimmed to its orders stream (the SSBJ stage ``orders_customer`` feeding
the A-DSP stage ``orders_promotions``): warehouse root ``s3://<bucket>/warehouse``, landing
zone ``s3://<bucket>/landing/orders``, the driver's own files (state store, Great
Expectations project, reports) in a local folder. One interval runs through ``enrich``
(masters, ingest and the stages, write-audit-publish). The published table must equal
DuckDB's join of the same inputs, every table must be in the bucket and nowhere on local
disk, and every table must read the same with delta-rs and delta-spark (at its latest
version and at version 0, checkpoints written every 2 commits).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import duckdb
import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from demo.data import deliver
from demo.prepare import demo_folder
from jobs.enrich import main as enrich
from pipeline.config import load_config
from pipeline.layout import WarehouseLayout
from tests.conftest import REPO_ROOT
from tests.demo_oracle import (
    ENRICHED_COLUMNS,
    delta_rows,
    enriched_orders,
    load_orders,
    normalise,
)
from tests.helpers import assert_same_multiset
from tests.object_store_server import S3Server
from warehouse.object_store import ObjectLocation, ObjectStore

pytestmark = pytest.mark.slow

CONFIG = REPO_ROOT / "configs" / "demo.yaml"
START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def object_store_config(folder: Path, bucket: str) -> Path:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["warehouse"]["root"] = f"s3://{bucket}/warehouse"
    raw["warehouse"]["local_root"] = str(folder / "local")
    raw["warehouse"]["engine"] = "embedded"
    # A checkpoint every 2 commits: the readers below read checkpoints in the store too.
    raw["warehouse"]["checkpoint_interval"] = 2
    raw["expectations_dir"] = str(REPO_ROOT / "expectations")
    raw["streams"]["orders"]["landing"] = f"s3://{bucket}/landing/orders"
    del raw["streams"]["lineitem"], raw["masters"]["partsupp"]
    del raw["quality"]["lineitem_suppliers"]
    raw["stages"] = [s for s in raw["stages"] if s["output"] != "lineitem_suppliers"]
    path = folder / "demo-s3.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_demo_pipeline_on_an_object_store_equals_duckdb(
    spark: SparkSession, s3_env: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    config_path = object_store_config(tmp_path, s3_bucket)
    base = ["--config", str(config_path)]
    demo = ["demo-data", "--scale", "0.002", "--intervals", "1", "--start", START.isoformat()]
    assert enrich([*base, *demo]) == 0
    config = load_config(config_path)
    layout = WarehouseLayout.of(config)
    outbox = demo_folder(config) / "outbox"
    assert json.loads((outbox / "manifest.json").read_text())["streams"] == ["orders"]
    deliver(outbox, "orders", 0, config.streams["orders"].landing)
    assert enrich([*base, "run", "--run-id", "i0"]) == 0
    assert enrich([*base, "validate", "--run-id", "i0"]) == 0

    options = ObjectStore.from_environment().delta_options()
    tables = {
        "master customer": layout.master(config, "customer"),
        "master promotions": layout.master(config, "promotions"),
        "bronze orders": layout.bronze("orders"),
        "ingest quarantine orders": layout.quarantine("orders"),
        "quality results": layout.quality_results(),
    }
    for stage in config.stages:
        tables[f"silver {stage.output}"] = layout.staged(stage.output)
        tables[f"gold {stage.output}"] = layout.published(stage.output)
    # Every table is in the bucket, none on local disk.
    client = s3_env.client()

    def log_keys(path: str) -> list[str]:
        prefix = f"{ObjectLocation.parse(path).key}/_delta_log/"
        listed = client.list_objects_v2(Bucket=s3_bucket, Prefix=prefix)
        return [o["Key"] for o in listed.get("Contents", [])]

    for name, path in tables.items():
        where = ObjectLocation.parse(path)
        assert where.bucket == s3_bucket, (name, path)
        assert log_keys(path), f"{name}: no commit in {path}"
    local = {p.relative_to(tmp_path).parts[:2] for p in (tmp_path / "local").rglob("*")}
    driver_files = {"_state", "_quality", "_reports", "outbox", "tpch"}
    assert {parts[1] for parts in local if len(parts) > 1} <= driver_files

    # The published table equals DuckDB's join of the delivered files and the masters.
    con = duckdb.connect()
    masters = {
        name: DeltaTable(layout.master(config, name), storage_options=options).to_pyarrow_table()
        for name in config.masters
    }
    versions = {
        name: DeltaTable(layout.master(config, name), storage_options=options).version()
        for name in config.masters
    }
    delivered = outbox / "orders" / "0000"
    assert load_orders(con, f"{delivered}/*.json") == delivered_rows(delivered)
    expected = enriched_orders(con, masters, versions)
    assert expected
    assert_same_multiset(
        delta_rows(layout.published("orders_enriched"), ENRICHED_COLUMNS, options), expected
    )

    checkpointed = [
        name
        for name, path in tables.items()
        if any(key.endswith(".checkpoint.parquet") for key in log_keys(path))
    ]
    assert "silver orders_customer" in checkpointed, checkpointed

    # delta-spark reads every table as delta-rs does, at its latest version and at 0.
    for name, path in tables.items():
        latest = DeltaTable(path, storage_options=options)
        columns = latest.schema().to_arrow().names
        for version in sorted({0, latest.version()}):
            by_rs = DeltaTable(path, version=version, storage_options=options)
            by_spark = spark.read.format("delta").option("versionAsOf", version).load(path)
            assert_same_multiset(
                [tuple(normalise(r[c]) for c in columns) for r in by_spark.collect()],
                [
                    tuple(normalise(r[c]) for c in columns)
                    for r in by_rs.to_pyarrow_table(columns=columns).to_pylist()
                ],
            )
            assert by_rs.version() == version, name


def delivered_rows(folder: Path) -> int:
    return sum(1 for path in folder.glob("*.json") for _ in path.open())
