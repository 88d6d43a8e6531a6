"""Suite files load by name, carry the config's checks, and bad files fail clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common.errors import ConfigError
from pipeline.config import load_config
from quality.config import QualityConfig
from quality.suites import available_suites, load_suite
from tests.conftest import REPO_ROOT

EXPECTATIONS = REPO_ROOT / "expectations"


def test_every_suite_the_demo_names_loads_with_its_config_checks() -> None:
    config = load_config(REPO_ROOT / "configs" / "demo.yaml")
    assert set(config.quality) == set(config.outputs()), "one suite per output table"
    for table, quality in config.quality.items():
        for name in quality.suites:
            suite = load_suite(EXPECTATIONS, name, quality)
            types = [e.expectation_type for e in suite.expectations]
            assert "expect_table_columns_to_match_set" in types
            assert "expect_column_values_to_not_be_null" in types
            assert "expect_compound_columns_to_be_unique" in types
            assert types.count("unexpected_rows_expectation") >= 2  # conservation, freshness
            ranges = [
                e.configuration.kwargs["column"]
                for e in suite.expectations
                if e.expectation_type == "expect_column_values_to_be_between"
            ]
            assert sorted(ranges) == sorted(quality.value_ranges), table


def test_config_ranges_and_sets_become_expectations(tmp_path: Path) -> None:
    (tmp_path / "s.json").write_text(json.dumps({"name": "s", "expectations": []}))
    quality = QualityConfig(
        suites=["s"], value_ranges={"price": (0, None)}, value_sets={"flag": ["A", "B"]}
    )
    suite = load_suite(tmp_path, "s", quality)
    configs = {e.expectation_type: e.configuration.kwargs for e in suite.expectations}
    assert configs["expect_column_values_to_be_between"]["min_value"] == 0
    assert configs["expect_column_values_to_be_between"].get("max_value") is None
    assert configs["expect_column_values_to_be_in_set"]["value_set"] == ["A", "B"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "expected the file"),
        ("{not json", "not valid JSON"),
        ('{"name": "s"}', "'expectations' list"),
        ('{"name": "other", "expectations": []}', "its name is 'other'"),
        (
            '{"name": "s", "expectations": [{"type": "expect_column_values_to_not_be_null", '
            '"kwargs": {}}]}',
            "expectation 0 \\(expect_column_values_to_not_be_null\\) is not valid",
        ),
        (
            '{"name": "s", "expectations": [{"type": "expect_no_such_thing", "kwargs": {}}]}',
            "expectation 0 \\(expect_no_such_thing\\) is not valid",
        ),
    ],
)
def test_bad_suite_files_are_config_errors(
    tmp_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "s.json").write_text(content)
    (tmp_path / "good.json").write_text('{"name": "good", "expectations": []}')
    with pytest.raises(ConfigError, match=message) as error:
        load_suite(tmp_path, "s", QualityConfig(suites=["s"]))
    if content is None:
        assert "good" in str(error.value)
    assert available_suites(tmp_path)
