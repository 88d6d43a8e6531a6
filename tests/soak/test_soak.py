"""Two soak trials in CI on the embedded engine (the default), one with its state in
PostgreSQL; the full run, which gives half its trials to the native engine, is a command
(a native trial takes 2-4 times as long: BENCHMARKS.md, section 6).

    .venv/bin/python -m tests.soak.run_soak --trials 100 --seed 1 --out soak.md

Each trial delivers bad files, re-deliveries and re-sent ids, commits master changes
between commands (append, MERGE, overwrite) and runs ``maintain``, SIGKILLs the worker at
a random crash point, reruns it, and checks bronze, the quarantines, silver, gold and the
late table of an equi and a theta stage against the DuckDB oracle, by recorded master
version (see :mod:`tests.soak.trial`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.soak.run_soak import run_soak

pytestmark = pytest.mark.slow


def test_soak_trials_lose_and_duplicate_nothing(tmp_path: Path, postgres_url: str) -> None:
    # Seed 24: SSBJ waiting for late master rows in its state; seed 25: the plain join
    # waiting 2h for them in its late table, its state in
    # PostgreSQL. Both on the embedded engine, both re-send ids and see every kind of master
    # commit and a maintain between their commands.
    result = run_soak(tmp_path / "soak", trials=2, seed=24, state_stores=(None, postgres_url))
    print(result.summary())
    assert result.ok, result.summary()
    assert result.kills == 2, result.summary()
    assert {c.engine for c in result.checks} == {"embedded"}
    assert {c.state_store for c in result.checks} == {"sqlite", "postgres"}
    assert result.rows_checked > 500
    assert result.lost == 0 and result.duplicated == 0
