"""One QualityGate per GX project per process, each writing to its own project."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from quality.gate import QualityGate


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
