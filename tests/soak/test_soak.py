"""A few soak trials in CI, one with its state in PostgreSQL; the full run is a command.

    .venv/bin/python -m tests.soak.run_soak --trials 100 --seed 1

Each trial delivers bad files and re-deliveries, SIGKILLs the worker at a random crash
point, reruns it, and checks bronze, the ingest quarantine, silver and gold against the
DuckDB oracle as multisets (see :mod:`tests.soak.trial`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak.run_soak import run_soak

pytestmark = pytest.mark.slow


def test_soak_trials_lose_and_duplicate_nothing(tmp_path: Path, postgres_url: str) -> None:
    # Seed 9 (plain join) is killed after the 5th Delta commit of a run, seed 10 (SSBJ)
    # after the 2nd of the final drain (both checked below); the second trial keeps its
    # state store in PostgreSQL.
    result = run_soak(tmp_path / "soak", trials=2, seed=9, state_stores=(None, postgres_url))
    print(result.summary())
    assert result.ok, result.summary()
    assert result.kills == 2, result.summary()
    assert result.rows_checked > 200
    assert result.lost == 0 and result.duplicated == 0
