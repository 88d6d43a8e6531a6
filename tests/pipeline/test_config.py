"""Config validation: bad keys and values are refused with the offending key named."""

from __future__ import annotations

import copy
import logging
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.errors import ConfigError
from common.secrets import redact
from pipeline.config import load_config, parse_config
from pipeline.dag_generator import render_dag, render_quality_dag
from tests.conftest import REPO_ROOT
from tests.helpers import json_stream

VALID: dict[str, Any] = {
    "name": "t",
    "streams": {
        "orders": json_stream("landing/orders", ["id bigint not null", "k bigint", "ts timestamp"])
    },
    "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "mv"]}},
    "stages": [
        {
            "name": "s1",
            "kind": "equi",
            "input": "orders",
            "master": "m",
            "join_on": {"k": "mk"},
            "output": "out1",
        }
    ],
}


def mutated(path: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(VALID)
    node: Any = raw
    *parents, leaf = path.split(".")
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    if value is KeyError:
        del node[leaf]
    else:
        node[int(leaf) if leaf.isdigit() else leaf] = value
    return raw


def test_valid_config_parses() -> None:
    config = parse_config(VALID)
    assert config.stage("s1").output == "out1"
    assert config.schedule.interval_delta.total_seconds() == 3600


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("bogus", 1, "bogus: Extra inputs are not permitted"),
        (
            "streams.orders.format",
            "xml",
            "streams.orders.format: Input should be 'json', 'csv' or 'parquet'",
        ),
        ("streams.orders.columns.1", "k bignum", "unknown column type 'bignum'"),
        (
            "streams.orders.columns.1",
            {"name": "k", "type": "bignum"},
            "streams.orders.columns.1.type: unknown column type 'bignum'",
        ),
        (
            "streams.orders.columns.1",
            "k",
            "streams.orders.columns.1: column 'k': expected 'NAME TYPE' or 'NAME TYPE not null'",
        ),
        ("streams.orders.columns.1", "k bigint null", "column 'k bigint null': expected"),
        ("streams.orders.event_time", "nope", "event_time: column 'nope' is not declared"),
        ("streams.orders.event_time", "k", "must be a timestamp, is bigint"),
        ("stages.0.input", "ordrs", "stages.0.input: unknown table 'ordrs'"),
        ("stages.0.master", "mm", "stages.0.master: unknown master 'mm'"),
        (
            "stages.0.join_on",
            {"k": "zz"},
            "stages.0.join_on: master columns ['zz'] are not projected",
        ),
        ("stages.0.join", "outer", "stages.0.equi.join: Input should be 'inner' or 'left'"),
        ("stages.0.kind", "fuzzy", "stages.0: Input tag 'fuzzy' found using 'kind' does not match"),
        (
            "stages.0.operator",
            {"partitions": 0},
            "stages.0.equi.operator.partitions: Input should be greater than or equal to 1",
        ),
        (
            "stages.0.operator",
            {"mode": "meshjoin", "key_counts": "sketch"},
            "stages.0.equi.operator: key_counts: sketch bounds the counters",
        ),
        (
            "stages.0.operator",
            {"split_hot_keys": None, "split_ways": 2},
            "split_ways: 2 bounds how hot values are split, but split_hot_keys is null",
        ),
        (
            "stages.0.operator",
            {"split_ways": 1},
            "stages.0.equi.operator.split_ways: Input should be greater than or equal to 2",
        ),
        (
            "stages.0.operator",
            {"sketch_width": 8},
            "stages.0.equi.operator.sketch_width: Input should be greater than or equal to 16",
        ),
        ("schedule", {"interval": "5 parsecs"}, "schedule.interval: expected a duration like 30s"),
        (
            "schedule",
            {"start": "2024-01-02T00:00:00", "end": "2024-01-01T00:00:00"},
            "schedule: end: 2024-01-01T00:00:00 is before start 2024-01-02T00:00:00; expected",
        ),
        ("quality", {"nope": {}}, "quality.nope: not an output table"),
        ("masters.m.columns", [], "masters.m.columns: List should have at least 1 item"),
    ],
)
def test_bad_values_name_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(mutated(path, value))
    assert message in str(info.value)


def test_a_column_in_one_string_is_the_mapping_it_abbreviates() -> None:
    spelled_out = mutated(
        "streams.orders.columns",
        [
            {"name": "id", "type": "bigint", "nullable": False},
            {"name": "k", "type": "bigint"},
            {"name": "ts", "type": "timestamp"},
        ],
    )
    assert parse_config(spelled_out) == parse_config(VALID)
    price = parse_config(mutated("streams.orders.columns.1", "k  Decimal(10, 2)  NOT NULL"))
    column = price.streams["orders"].columns[1]
    assert (column.name, column.type, column.nullable) == ("k", "decimal(10, 2)", False)


def with_theta_stage(predicate: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """VALID with a second stage: a theta join of ``out1`` to master ``m``."""
    raw = copy.deepcopy(VALID)
    stage = {"name": "s2", "kind": "theta", "input": "out1", "master": "m", "output": "out2"}
    raw["stages"].append({**stage, "predicate": predicate, **extra})
    return raw


def test_theta_predicate_needs_its_columns() -> None:
    raw = with_theta_stage({"type": "range", "stream_column": "k", "lo": "mk"})
    with pytest.raises(
        ConfigError, match=r"stages\.1\.theta\.predicate: a range predicate needs 'lo' and 'hi'"
    ):
        parse_config(raw)


def test_a_negative_sample_threshold_names_the_theta_key() -> None:
    raw = with_theta_stage(
        {"type": "band", "stream_column": "k", "master_column": "mk", "eps": 1},
        operator={"sample_above_bytes": -1},
    )
    with pytest.raises(
        ConfigError,
        match=r"stages\.1\.theta\.operator\.sample_above_bytes: Input should be greater than",
    ):
        parse_config(raw)


def test_yaml_errors_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("just a string\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(scalar)


def test_demo_config_is_valid_and_paths_are_anchored(workdir: Path) -> None:
    config = load_config(REPO_ROOT / "configs" / "demo.yaml")
    assert config.warehouse.root == str(workdir / "var" / "demo" / "warehouse")
    assert [s.name for s in config.stages] == [
        "orders_customer",
        "orders_promotions",
        "lineitem_partsupp",
    ]


# ---------------------------------------------------------------------- ${VAR} references


def test_env_references_are_resolved_at_load_time_and_never_written_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    password = f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv("ENRICH_TEST_DB_PASSWORD", password)
    monkeypatch.setenv("ENRICH_TEST_DB_HOST", "db.internal")
    monkeypatch.chdir(tmp_path)
    raw = copy.deepcopy(VALID)
    raw["warehouse"] = {
        "state_store": "postgresql+psycopg://enrich:${ENRICH_TEST_DB_PASSWORD}"
        "@${ENRICH_TEST_DB_HOST}:5432/enrich"
    }
    raw["streams"]["orders"]["landing"] = "landing/$${not_a_reference}"
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw))
    written = path.read_text()

    with caplog.at_level(logging.DEBUG):
        config = load_config(path)

    assert config.warehouse.state_store == (
        f"postgresql+psycopg://enrich:{password}@db.internal:5432/enrich"
    )
    assert config.streams["orders"].landing == str(tmp_path / "landing" / "${not_a_reference}")
    assert path.read_text() == written  # the file keeps its references
    assert password not in caplog.text
    assert password not in repr(config) and password not in str(config.warehouse)
    assert "enrich:***@db.internal" in repr(config.warehouse)
    dag_path = tmp_path / "dags" / "enrich_t.py"
    for text in (render_dag(config, path, dag_path), render_quality_dag(config, path, dag_path)):
        assert password not in text and "db.internal" not in text
    assert redact(f"retrying with {password}") == "retrying with ***"  # registered for logs


def test_env_references_with_a_default_use_it_when_the_variable_is_unset_or_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ENRICH_TEST_ROOT", raising=False)
    raw = mutated("warehouse", {"root": "${ENRICH_TEST_ROOT:-var/wh}/x", "engine": "auto"})
    assert parse_config(raw).warehouse.root == "var/wh/x"
    monkeypatch.setenv("ENRICH_TEST_ROOT", "")
    assert parse_config(raw).warehouse.root == "var/wh/x"
    monkeypatch.setenv("ENRICH_TEST_ROOT", "s3://bucket/wh")
    assert parse_config(raw).warehouse.root == "s3://bucket/wh/x"
    empty = mutated("warehouse", {"root": "a${ENRICH_TEST_UNSET_VARIABLE:-}b"})
    monkeypatch.delenv("ENRICH_TEST_UNSET_VARIABLE", raising=False)
    assert parse_config(empty).warehouse.root == "ab"


def test_env_values_of_secret_looking_keys_are_masked_in_logs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    access_key, region = f"s3-{uuid.uuid4().hex}", f"region-{uuid.uuid4().hex}"
    monkeypatch.setenv("ENRICH_TEST_S3", access_key)
    monkeypatch.setenv("ENRICH_TEST_REGION", region)
    config = parse_config(
        mutated(
            "spark",
            {
                "conf": {
                    "spark.hadoop.fs.s3a.secret.key": "${ENRICH_TEST_S3}",
                    "spark.hadoop.fs.s3a.endpoint.region": "${ENRICH_TEST_REGION}",
                }
            },
        )
    )
    assert config.spark.conf["spark.hadoop.fs.s3a.secret.key"] == access_key
    assert redact(f"key {access_key} in {region}") == f"key *** in {region}"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "postgresql://u:${ENRICH_TEST_UNSET_VARIABLE}@h/db",
            "warehouse.state_store: environment variable ENRICH_TEST_UNSET_VARIABLE is not set "
            "(referenced as ${ENRICH_TEST_UNSET_VARIABLE})",
        ),
        ("${1NOPE}", "warehouse.state_store: expected ${NAME} at character 1"),
        ("sqlite:///${UNCLOSED", "warehouse.state_store: expected ${NAME} at character 11"),
    ],
)
def test_bad_env_references_name_the_key_and_variable(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENRICH_TEST_UNSET_VARIABLE", raising=False)
    raw = mutated("warehouse", {"state_store": value})
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert message in str(info.value)
    assert raw["warehouse"]["state_store"] == value  # the input is left as it was


def test_an_object_store_root_keeps_the_drivers_files_in_a_local_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipeline.layout import WarehouseLayout

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ENRICH_STATE_STORE", raising=False)
    raw = copy.deepcopy(VALID)
    raw["warehouse"] = {"root": "s3://bucket/wh"}
    raw["streams"]["orders"]["landing"] = "s3://bucket/landing/orders"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(path)
    assert config.warehouse.root == "s3://bucket/wh" and config.uses_object_store()
    assert config.warehouse.local_root == str(tmp_path / "var" / "t")
    assert config.warehouse.resolved_state_store() == (
        f"sqlite:///{tmp_path / 'var' / 't' / '_state' / 'pipeline.db'}"
    )
    layout = WarehouseLayout.of(config)
    assert layout.published("out1") == "s3://bucket/wh/gold/out1"
    assert layout.gx_project() == str(tmp_path / "var" / "t" / "_quality")
    assert layout.master(config, "m") == "s3://bucket/wh/masters/m"
    # An explicit local folder is anchored like every path; a local root is its own.
    raw["warehouse"]["local_root"] = "driver"
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path).warehouse.local_root == str(tmp_path / "driver")
    assert not parse_config(VALID).uses_object_store()
    # Parsed without load_config (no anchoring), an object-store root has no local folder.
    with pytest.raises(ConfigError, match=r"warehouse\.local_root"):
        parse_config({**VALID, "warehouse": {"root": "s3://bucket/wh"}}).warehouse.driver_root()


@pytest.mark.parametrize(
    ("warehouse", "landings", "message"),
    [
        ("wh", {"orders": "wh/landing/orders"}, "and the warehouse root 'wh' must not hold"),
        ("s3://b/wh", {"orders": "s3://b/wh/in"}, "must not hold one another"),
        ("s3://b/wh", {"orders": "s3://b/in", "b": "s3://b/in/b"}, "holds the landing zone of"),
        ("s3://b/wh", {"orders": "s3://b/in[1]"}, r"expected s3://bucket/prefix without any of"),
        ("s3://b/wh", {"orders": "s3:///no-bucket"}, r"expected s3://bucket/prefix"),
    ],
)
def test_landing_zones_that_nest_or_glob_are_refused(
    warehouse: str, landings: dict[str, str], message: str
) -> None:
    raw = copy.deepcopy(VALID)
    raw["warehouse"] = {"root": warehouse}
    for name, landing in landings.items():
        raw["streams"][name] = {**raw["streams"]["orders"], "landing": landing}
    with pytest.raises(ConfigError, match=r"streams\.\w+\.landing") as info:
        parse_config(raw)
    assert re.search(message, str(info.value)), str(info.value)
    # Side by side, every zone a folder of its own, it parses.
    raw["streams"] = {n: {**s, "landing": f"s3://b/landing/{n}"} for n, s in raw["streams"].items()}
    assert parse_config(raw).uses_object_store()
