"""Config validation: bad keys and values are refused with the offending key named."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from common.errors import ConfigError
from pipeline.config import load_config, parse_config
from tests.conftest import REPO_ROOT

VALID: dict[str, Any] = {
    "name": "t",
    "streams": {
        "orders": {
            "landing": "landing/orders",
            "format": "json",
            "event_time": "ts",
            "id_column": "id",
            "columns": [
                {"name": "id", "type": "bigint", "nullable": False},
                {"name": "k", "type": "bigint"},
                {"name": "ts", "type": "timestamp"},
            ],
        }
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
        ("streams.orders.columns.1.type", "bignum", "unknown column type 'bignum'"),
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
        ("schedule", {"interval": "5 parsecs"}, "schedule.interval: expected a duration like 30s"),
        ("quality", {"nope": {}}, "quality.nope: not an output table"),
        ("masters.m.columns", [], "masters.m.columns: List should have at least 1 item"),
    ],
)
def test_bad_values_name_the_key(path: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(mutated(path, value))
    assert message in str(info.value)


def test_theta_predicate_needs_its_columns() -> None:
    raw = copy.deepcopy(VALID)
    raw["stages"].append(
        {
            "name": "s2",
            "kind": "theta",
            "input": "out1",
            "master": "m",
            "predicate": {"type": "range", "stream_column": "k", "lo": "mk"},
            "output": "out2",
        }
    )
    with pytest.raises(
        ConfigError, match=r"stages\.1\.theta\.predicate: a range predicate needs 'lo' and 'hi'"
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


def test_demo_config_is_valid_and_paths_are_anchored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_config(REPO_ROOT / "configs" / "demo.yaml")
    assert config.warehouse.root == str(tmp_path / "var" / "demo" / "warehouse")
    assert [s.name for s in config.stages] == [
        "orders_customer",
        "orders_promotions",
        "lineitem_partsupp",
    ]
