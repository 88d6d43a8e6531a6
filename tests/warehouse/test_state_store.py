"""The SQLAlchemy state store: ledger, landing files, offsets, operator state, pins."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from common.errors import StateStoreError
from warehouse.state_store import SCHEMA_VERSION, StateStore


@pytest.fixture
def store(tmp_path: Path) -> StateStore:
    return StateStore(f"sqlite:///{tmp_path / 'state' / 'store.db'}")


def test_run_ledger_counts_attempts_and_records_outcome(store: StateStore) -> None:
    store.start_run("r1", "scheduled")
    store.finish_run("r1", error="boom")
    store.start_run("r1", "scheduled")
    store.finish_run("r1")
    (run,) = store.runs()
    assert (run.run_id, run.status, run.error) == ("r1", "succeeded", None)
    with pytest.raises(StateStoreError, match="no run 'nope'"):
        store.finish_run("nope")


def test_landing_file_is_registered_once(store: StateStore) -> None:
    store.start_run("r1", "ingest")
    row = store.register_landing_file("orders", "/l/a.json", 10, "ab" * 32, "r1")
    store.update_landing_file(row.id, status="loaded", records_loaded=3)
    with pytest.raises(StateStoreError, match="UNIQUE"):
        store.register_landing_file("orders", "/l/a.json", 10, "ab" * 32, "r1")
    found = store.landing_file("orders", "/l/a.json")
    assert found is not None and (found.status, found.records_loaded) == ("loaded", 3)


def test_offsets_state_metrics_and_pins_round_trip(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = StateStore(url)
    store.set_offset("enrich", input_version=4, step_seq=2)
    store.save_operator_state("enrich", {"cycle": 3, "keys": {"7": [1, 2]}})
    store.record_metrics("r1", "enrich", 1, {"tuples_in": 10, "cache_hits": 4})
    store.pin("/w/customer", 5, "enrich")
    store.pin("/w/customer", 6, "enrich")
    store.unpin("/w/customer", "enrich", keep=[6])

    reopened = StateStore(url)  # a new process sees the same control data
    offset = reopened.offset("enrich")
    assert (offset.input_version, offset.step_seq) == (4, 2)
    assert reopened.offset("other").input_version == 0
    assert reopened.operator_state("enrich") == {"cycle": 3, "keys": {"7": [1, 2]}}
    assert {(m.name, m.value) for m in reopened.metrics("r1")} == {
        ("tuples_in", 10.0),
        ("cache_hits", 4.0),
    }
    assert reopened.pinned_versions("/w/customer") == [6]


def test_store_written_by_newer_code_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = StateStore(url)
    with store._engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO schema_version (version, applied_at) "
                f"VALUES ({SCHEMA_VERSION + 1}, CURRENT_TIMESTAMP)"
            )
        )
    with pytest.raises(StateStoreError, match="newer than this code"):
        StateStore(url)


def test_bad_url_is_a_state_store_error() -> None:
    with pytest.raises(StateStoreError, match="not usable"):
        StateStore("nosuchdialect://x")
