"""One QualityGate per GX project per process, each writing to its own project."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from quality.gate import QualityGate

if TYPE_CHECKING:
    from great_expectations.core.expectation_suite import ExpectationSuite

# A gate's Spark datasource starts a Spark session when none runs: the suite's own session
# (with the delta-spark jars) must come first, whichever test file this worker runs next.
pytestmark = pytest.mark.usefixtures("spark")


def runs_stored(project: Path) -> set[str]:
    results = project / "gx" / "uncommitted" / "validations"
    return {p.name for p in results.glob("*/*") if p.is_dir()}


def test_a_gate_used_again_after_another_projects_writes_to_its_own(tmp_path: Path) -> None:
    from great_expectations.core.expectation_suite import ExpectationSuite

    def suite() -> ExpectationSuite:
        return ExpectationSuite(
            name="ids",
            expectations=[
                {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}
            ],
        )

    batch = pd.DataFrame({"id": [1, 2, 3]})
    a = QualityGate.of(tmp_path / "a")
    assert QualityGate.of(tmp_path / "a") is a  # kept for the process
    a.validate("t", suite(), batch, "run-a1")
    b = QualityGate.of(tmp_path / "b")
    b.validate("t", suite(), batch, "run-b1")
    # GX resolves stores through its one current project: b's, until a is made current.
    QualityGate.of(tmp_path / "a").validate("t", suite(), batch, "run-a2")
    assert runs_stored(tmp_path / "a") == {"run-a1", "run-a2"}
    assert runs_stored(tmp_path / "b") == {"run-b1"}


def ranged(high: float) -> ExpectationSuite:
    from great_expectations.core.expectation_suite import ExpectationSuite

    return ExpectationSuite(
        name="ranges",
        expectations=[
            {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": "p", "min_value": 0, "max_value": high},
            }
        ],
    )


def test_a_suite_is_saved_again_only_when_it_changes_or_another_writer_saved_over_it(
    tmp_path: Path,
) -> None:
    batch = pd.DataFrame({"p": [1.0, 5.0, 9.0]})
    project = tmp_path / "p"
    gate = QualityGate(project)
    assert gate.validate("t", ranged(10), batch, "r1").success
    # A pandas batch is validated in memory: GX stores the suite as "<suite>__in_memory".
    saved = project / "gx" / "expectations" / "ranges__in_memory.json"
    stamp = saved.stat().st_mtime_ns
    assert gate.validate("t", ranged(10), batch, "r2").success
    assert saved.stat().st_mtime_ns == stamp  # the same suite again: nothing saved
    assert not gate.validate("t", ranged(6), batch, "r3").success  # changed: saved, applied
    # Another process's gate saves its own version of the suite and checkpoint.
    other = QualityGate(project)
    assert other.validate("t", ranged(10), batch, "o1").success
    assert not gate.validate("t", ranged(6), batch, "r4").success
    assert other.validate("t", ranged(10), batch, "o2").success
    assert runs_stored(project) == {"r1", "r2", "r3", "r4", "o1", "o2"}


def test_config_variables_are_dropped_only_when_the_project_defines_none(tmp_path: Path) -> None:
    from great_expectations.core.config_provider import (
        _ConfigurationVariablesConfigurationProvider,
    )
    from great_expectations.core.expectation_suite import ExpectationSuite

    suite = ExpectationSuite(
        name="ids",
        expectations=[{"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "id"}}],
    )
    batch = pd.DataFrame({"id": [1, None]})

    def provides_variables(gate: QualityGate) -> bool:
        providers = gate._context.config_provider._providers  # type: ignore[attr-defined]
        return _ConfigurationVariablesConfigurationProvider in providers

    scaffolded = QualityGate(tmp_path / "plain")
    config = (tmp_path / "plain" / "gx" / "great_expectations.yml").read_text()
    assert "\nconfig_variables_file_path:\n" in config
    assert not provides_variables(scaffolded)
    outcome = scaffolded.validate("t", suite, batch, "run-1")  # GX still validates
    assert not outcome.success and [e.describe() for e in outcome.failures]

    # A project whose variables file defines a variable keeps it (and GX reads it).
    kept = tmp_path / "kept"
    QualityGate(kept)
    config_file = kept / "gx" / "great_expectations.yml"
    text = config_file.read_text().replace(
        "config_variables_file_path:\n",
        "config_variables_file_path: uncommitted/config_variables.yml\n",
    )
    config_file.write_text(text)
    (kept / "gx" / "uncommitted" / "config_variables.yml").write_text("my_secret: s3cr3t\n")
    reopened = QualityGate(kept)
    assert provides_variables(reopened)
    assert "config_variables_file_path: uncommitted/config_variables.yml" in config_file.read_text()
    assert reopened._context.config_variables["my_secret"] == "s3cr3t"

    # So does one naming a file of its own (the default file absent).
    custom = tmp_path / "custom"
    QualityGate(custom)
    config_file = custom / "gx" / "great_expectations.yml"
    config_file.write_text(
        config_file.read_text().replace(
            "config_variables_file_path:\n", "config_variables_file_path: conf/vars.yml\n"
        )
    )
    (custom / "gx" / "uncommitted" / "config_variables.yml").unlink(missing_ok=True)
    (custom / "gx" / "conf").mkdir()
    (custom / "gx" / "conf" / "vars.yml").write_text("my_secret: s3cr3t\n")
    assert provides_variables(QualityGate(custom))
    assert "config_variables_file_path: conf/vars.yml" in config_file.read_text()
