"""Expectation suites: reviewable JSON files in ``expectations/``, loaded by name.

A suite file ``<dir>/<name>.json`` is a Great Expectations 1.x suite in GX's own JSON form
(``{"name": ..., "expectations": [{"type": ..., "kwargs": {...}}], "meta": {...}}``), so a
team adds a suite by dropping a file there and naming it under ``quality.<table>.suites``
in the pipeline config; no code changes.

To each suite loaded for a table, :func:`config_expectations` adds the checks the config
declares for that table (``value_ranges``, ``value_sets``), so limits live in one place. A
table that names no suite but declares checks is validated against those checks alone
(:func:`config_suite`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import ConfigError
from quality.config import QualityConfig

if TYPE_CHECKING:
    from great_expectations.core.expectation_suite import ExpectationSuite


def available_suites(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.json"))


def read_suite_file(directory: Path, name: str) -> dict[str, Any]:
    path = directory / f"{name}.json"
    if not path.is_file():
        raise ConfigError(
            f"quality suite {name!r}: expected the file {path}; suites in {directory}: "
            f"{available_suites(directory)}"
        )
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"quality suite file {path} is not valid JSON: {e}") from e
    if not isinstance(raw, dict) or not isinstance(raw.get("expectations"), list):
        raise ConfigError(
            f"quality suite file {path}: expected an object with an 'expectations' list"
        )
    if raw.get("name", name) != name:
        raise ConfigError(
            f"quality suite file {path}: its name is {raw['name']!r}, expected {name!r} "
            "(the file name without .json)"
        )
    return raw


def config_expectations(quality: QualityConfig) -> list[dict[str, Any]]:
    expectations: list[dict[str, Any]] = []
    for column, (low, high) in sorted(quality.value_ranges.items()):
        expectations.append(
            {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": column, "min_value": low, "max_value": high},
                "meta": {"source": "pipeline config value_ranges"},
            }
        )
    for column, values in sorted(quality.value_sets.items()):
        expectations.append(
            {
                "type": "expect_column_values_to_be_in_set",
                "kwargs": {"column": column, "value_set": list(values)},
                "meta": {"source": "pipeline config value_sets"},
            }
        )
    return expectations


def load_suite(directory: Path, name: str, quality: QualityConfig) -> ExpectationSuite:
    """The suite ``name`` from its file plus the table's config-declared expectations."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    raw = read_suite_file(directory, name)
    expectations = [*raw["expectations"], *config_expectations(quality)]
    # GX logs and drops an invalid expectation instead of raising; a gate that silently
    # lost a check would pass bad data, so each one is built here first.
    for index, definition in enumerate(expectations):
        _check_expectation(directory / f"{name}.json", index, definition)
    return ExpectationSuite(name=name, expectations=expectations, meta=raw.get("meta") or {})


def config_suite(table: str, quality: QualityConfig) -> ExpectationSuite:
    """The config-declared checks of a table that names no suite, as a suite of their own
    (``<table>_config_checks``): declared limits are checked whether or not suites exist."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    name = f"{table}_config_checks"
    expectations = config_expectations(quality)
    for index, definition in enumerate(expectations):
        _check_expectation(Path(f"quality.{table}"), index, definition)
    return ExpectationSuite(name=name, expectations=expectations, meta={"source": "config"})


def _check_expectation(path: Path, index: int, definition: Any) -> None:
    from great_expectations.exceptions import GreatExpectationsError
    from great_expectations.expectations.expectation_configuration import (
        ExpectationConfiguration,
    )

    where = f"quality suite {path.stem!r} ({path}) expectation {index}"
    if not isinstance(definition, dict) or "type" not in definition:
        raise ConfigError(
            f"{where}: expected an object with 'type' and 'kwargs', got {definition!r}"
        )
    try:
        ExpectationConfiguration(
            type=definition["type"], kwargs=definition.get("kwargs") or {}
        ).to_domain_obj()
    except (GreatExpectationsError, TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{where} ({definition['type']}) is not valid: {e}") from e
