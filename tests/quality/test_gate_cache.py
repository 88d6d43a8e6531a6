"""One QualityGate per GX project per process, each writing to its own project."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from quality.gate import QualityGate

if TYPE_CHECKING:
    from great_expectations.core.expectation_suite import ExpectationSuite


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
