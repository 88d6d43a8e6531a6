"""The SQLAlchemy state store: ledger, landing files, offsets, operator state, pins.

Every test that takes ``state_store_url`` (tests/conftest.py) runs twice, on SQLite and on a
real PostgreSQL server, with the same assertions.
"""

from __future__ import annotations

import importlib.util
import math
import threading
import traceback
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from common.errors import DuplicateRecordError, StateStoreError
from tests.postgres import PostgresServer
from warehouse import state_landing
from warehouse.state_completeness import IntervalRecord
from warehouse.state_metrics import StepMetricValues
from warehouse.state_schema import SCHEMA_VERSION
from warehouse.state_store import StateStore
from warehouse.state_tables import REJECTED


@pytest.fixture
def store(state_store_url: str) -> StateStore:
    return StateStore(state_store_url)


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
    with pytest.raises(
        DuplicateRecordError,
        match=r"landing_files: \(stream, path\) = \('orders', '/l/a.json'\) is already recorded",
    ):
        store.register_landing_file("orders", "/l/a.json", 10, "ab" * 32, "r1")
    found = store.landing_file("orders", "/l/a.json")
    assert found is not None and (found.status, found.records_loaded) == ("loaded", 3)


def test_new_content_under_a_never_loaded_name_replaces_its_row_under_a_fresh_id(
    store: StateStore,
) -> None:
    store.start_run("r1", "ingest")
    old = store.register_landing_file("s", "/l/a.json", 10, "ab" * 32, "r1", status=REJECTED)
    later = store.register_landing_file("s", "/l/b.json", 10, "cd" * 32, "r1")
    with pytest.raises(StateStoreError, match=r"no landing file with id \d+ at s:/l/b.json"):
        store.register_landing_file("s", "/l/b.json", 5, "ef" * 32, "r1", replaces=old.id)
    new = store.register_landing_file("s", "/l/a.json", 5, "ef" * 32, "r1", replaces=old.id)
    assert new.id > later.id  # Delta skips an app-transaction version it has seen
    assert [(r.path, r.id, r.sha256) for r in store.landing_files("s")] == [
        ("/l/b.json", later.id, "cd" * 32),
        ("/l/a.json", new.id, "ef" * 32),
    ]


@pytest.mark.parametrize("per_query", [1, 500])
def test_landing_files_at_finds_the_ledger_rows_of_listed_paths(
    store: StateStore, monkeypatch: pytest.MonkeyPatch, per_query: int
) -> None:
    monkeypatch.setattr(state_landing, "PATHS_PER_QUERY", per_query)
    store.start_run("r1", "ingest")
    ids = {p: store.register_landing_file("s", p, 1, p * 8, "r1").id for p in ("/a", "/b", "/c")}
    store.register_landing_file("other", "/a", 1, "x" * 8, "r1")  # another stream's
    found = store.landing_files_at("s", ["/a", "/c", "/gone"])
    assert {p: row.id for p, row in found.items()} == {"/a": ids["/a"], "/c": ids["/c"]}
    assert store.landing_files_at("s", []) == {}


def test_landing_file_of_a_run_without_its_own_ledger_row(store: StateStore) -> None:
    # The pipeline's ledger rows are "<run id>/<command>", while ingestion registers files
    # under the run id itself; PostgreSQL enforces foreign keys, SQLite does not.
    store.start_run("scheduled__1/ingest", "scheduled")
    row = store.register_landing_file("orders", "/l/a.json", 10, "ab" * 32, "scheduled__1")
    assert row.run_id == "scheduled__1"


def test_byte_counts_beyond_32_bits_round_trip(store: StateStore) -> None:
    store.start_run("r1", "ingest")
    size = 5 * 2**30  # a 5 GiB landing file
    row = store.register_landing_file("orders", "/l/big.parquet", size, "cd" * 32, "r1")
    store.update_landing_file(row.id, status="loaded", records_loaded=3)
    found = store.landing_file("orders", "/l/big.parquet")
    assert found is not None and found.size_bytes == size


def test_timestamps_are_aware_utc_on_every_backend(store: StateStore) -> None:
    plus_two = timezone(timedelta(hours=2))
    start = datetime(2024, 1, 1, 2, 0, tzinfo=plus_two)  # 00:00 UTC
    store.start_run("r1", "scheduled", start, start + timedelta(hours=1))
    store.finish_run("r1")
    (run,) = store.runs()
    assert run.interval_start == datetime(2024, 1, 1, tzinfo=UTC)
    assert run.interval_end == datetime(2024, 1, 1, 1, tzinfo=UTC)
    for value in (run.interval_start, run.interval_end, run.started_at, run.finished_at):
        assert value is not None and value.utcoffset() == timedelta(0), value
    assert datetime.now(UTC) - run.started_at < timedelta(minutes=5)
    an_hour_ago_at_plus_two = (datetime.now(UTC) - timedelta(hours=1)).astimezone(plus_two)
    assert [r.run_id for r in store.runs(since=an_hour_ago_at_plus_two)] == ["r1"]
    assert store.runs(since=datetime.now(UTC) + timedelta(hours=1)) == []


def test_offsets_state_metrics_and_pins_round_trip(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    store.set_offset("enrich", input_version=4, step_seq=2)
    store.save_operator_state("enrich", {"cycle": 3, "keys": {"7": [1, 2]}})
    store.record_metrics("r1", "enrich", 1, {"tuples_in": 10, "cache_hits": 4})
    store.pin("/w/customer", 5, "enrich")
    store.pin("/w/customer", 6, "enrich")
    store.unpin("/w/customer", "enrich", keep=[6])
    store.dispose()

    reopened = StateStore(state_store_url)  # a new process sees the same control data
    offset = reopened.offset("enrich")
    assert (offset.input_version, offset.step_seq) == (4, 2)
    assert reopened.offset("other").input_version == 0
    assert reopened.operator_state("enrich") == {"cycle": 3, "keys": {"7": [1, 2]}}
    assert {(m.name, m.value) for m in reopened.metrics("r1")} == {
        ("tuples_in", 10.0),
        ("cache_hits", 4.0),
    }
    assert reopened.pinned_versions("/w/customer") == [6]


def test_operator_state_keeps_non_finite_floats(store: StateStore) -> None:
    # A theta stage's master statistics hold open value ranges such as [-inf, 12.5].
    state = {"ranges": [[-math.inf, 12.5], [0.0, math.inf]], "ratio": math.nan}
    store.save_operator_state("theta", state)
    store.complete_step("theta", input_version=1, step_seq=1, state=state)
    saved = store.operator_state("theta")
    assert saved is not None
    assert saved["ranges"] == [[-math.inf, 12.5], [0.0, math.inf]]
    assert math.isnan(saved["ratio"])


def test_store_written_by_newer_code_is_refused(state_store_url: str) -> None:
    store = StateStore(state_store_url)
    with store._engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO schema_version (version, applied_at) "
                f"VALUES ({SCHEMA_VERSION + 1}, CURRENT_TIMESTAMP)"
            )
        )
    store.dispose()
    with pytest.raises(StateStoreError, match="newer than this code"):
        StateStore(state_store_url)


# The landing_files columns each schema version added after the first.
ADDED_COLUMNS = {2: ("records_resent",), 3: ("etag",)}


def upgraded_from(url: str, version: int, path: str) -> StateStore:
    """A store with one loaded landing file at ``path`` (3 records), taken back to what
    schema ``version`` wrote (the later versions' columns dropped), then opened again: the
    upgrade under test."""
    store = StateStore(url)
    row = store.register_landing_file("s", path, 10, "0" * 64, "r1")
    store.update_landing_file(row.id, status="loaded", records_loaded=3)
    with store._engine.begin() as connection:
        for later in range(version + 1, SCHEMA_VERSION + 1):
            for column in ADDED_COLUMNS[later]:
                connection.execute(text(f"ALTER TABLE landing_files DROP COLUMN {column}"))
        connection.execute(text("DELETE FROM schema_version"))
        for earlier in range(1, version + 1):
            connection.execute(
                text(
                    "INSERT INTO schema_version (version, applied_at) "
                    f"VALUES ({earlier}, CURRENT_TIMESTAMP)"
                )
            )
    store.dispose()
    return StateStore(url)


def applied_versions(store: StateStore) -> list[int]:
    with store._engine.connect() as connection:
        versions = connection.execute(text("SELECT version FROM schema_version")).all()
    return sorted(v for (v,) in versions)


def test_a_version_1_store_gains_the_resent_count_and_keeps_its_rows(
    state_store_url: str,
) -> None:
    """Schema version 2 adds ``landing_files.records_resent`` to a store written by older
    code; its ledger rows stay, with no count until a file records one."""
    upgraded = upgraded_from(state_store_url, 1, "/l/a.json")
    found = upgraded.landing_file("s", "/l/a.json")
    assert found is not None and (found.records_loaded, found.records_resent) == (3, None)
    upgraded.update_landing_file(found.id, records_resent=4)
    again = upgraded.landing_file("s", "/l/a.json")
    assert again is not None and again.records_resent == 4
    assert applied_versions(upgraded) == [1, 2, 3]
    upgraded.dispose()


def test_a_version_2_store_gains_the_etag_column_and_keeps_its_rows(
    state_store_url: str,
) -> None:
    """Schema version 3 adds ``landing_files.etag`` to a store written by version 2: its
    rows have none (ingestion reads such objects once more), new rows and updates keep one."""
    upgraded = upgraded_from(state_store_url, 2, "s3://b/l/a.json")
    found = upgraded.landing_file("s", "s3://b/l/a.json")
    assert found is not None
    assert (found.status, found.records_loaded, found.etag) == ("loaded", 3, None)
    tag = '"5d41402abc4b2a76b9719d911017c592-1"'  # as S3 gives it, quotes and all
    upgraded.update_landing_file(found.id, etag=tag)
    again = upgraded.landing_file("s", "s3://b/l/a.json")
    assert again is not None and again.etag == tag
    new = upgraded.register_landing_file("s", "s3://b/l/b.json", 5, "1" * 64, "r2", etag='"x"')
    assert new.etag == '"x"' and new.id > found.id
    assert applied_versions(upgraded) == [1, 2, 3] == [*range(1, SCHEMA_VERSION + 1)]
    upgraded.dispose()


def open_at_once(
    url: str, openers: int, timeout: float
) -> tuple[list[StateStore], list[BaseException]]:
    """Open ``url`` from ``openers`` threads released together: the stores and the errors."""
    barrier = threading.Barrier(openers)
    errors: list[BaseException] = []
    stores: list[StateStore] = []

    def open_store() -> None:
        barrier.wait()
        try:
            stores.append(StateStore(url))
        except StateStoreError as e:  # collected and reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=open_store) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return stores, errors


def test_processes_opening_a_fresh_store_at_once_all_succeed(state_store_url: str) -> None:
    # Airflow starts the first tasks of a new deployment together: each creates the schema.
    openers = 4
    stores, errors = open_at_once(state_store_url, openers, timeout=120)
    assert errors == []
    assert len(stores) == openers
    with stores[0]._engine.connect() as connection:
        versions = connection.execute(text("SELECT version FROM schema_version")).all()
    assert [v for (v,) in versions] == [SCHEMA_VERSION]
    for store in stores:
        store.dispose()


def test_many_fresh_sqlite_files_opened_at_once_all_succeed(tmp_path: Path) -> None:
    # Switching a fresh file to WAL fails at once ("database is locked", no busy wait) when
    # two connections switch together; that happened in a few percent of single trials, so
    # the race runs on many fresh files. Each must open on every thread and end in WAL.
    for trial in range(100):
        url = f"sqlite:///{tmp_path / str(trial) / 'store.db'}"
        stores, errors = open_at_once(url, openers=4, timeout=60)
        assert errors == [], f"round {trial}"
        with stores[0].engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        for store in stores:
            store.dispose()


# ---------------------------------------------------------------------- URLs and secrets


def _full_text(error: BaseException | None) -> str:
    """The messages of the error and of every error chained to it, as a traceback shows them."""
    messages = []
    while error is not None:
        messages += traceback.format_exception_only(error)
        error = error.__cause__ or error.__context__
    return "".join(messages)


def test_unreachable_postgres_error_hides_the_password() -> None:
    with pytest.raises(StateStoreError) as info:
        StateStore("postgresql://u:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in _full_text(info.value)
    assert "postgresql://u:***@127.0.0.1:1/db" in str(info.value)
    assert "Connection refused" in str(info.value)


def test_real_server_error_hides_the_password(postgres_server: PostgresServer) -> None:
    url = postgres_server.url("no_such_database")
    with pytest.raises(StateStoreError, match="no_such_database") as info:
        StateStore(url)
    assert postgres_server.password not in _full_text(info.value)
    assert "enrich_test:***@127.0.0.1" in str(info.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nosuchdialect://u:pa55w0rd@x/db", "nosuchdialect://u:***@x/db"),
        ("postgresql://u:pa55w0rd@h:notaport/db", "postgresql://u:***@h:notaport/db"),
        # an unencoded '@' and ':' in the password: the URL does not parse
        ("postgresql://u:pa55@w0rd:x@h:notaport/db", "postgresql://u:***@h:notaport/db"),
    ],
)
def test_bad_url_is_a_state_store_error_without_the_password(url: str, shown: str) -> None:
    with pytest.raises(StateStoreError, match="not usable") as info:
        StateStore(url)
    assert "pa55" not in _full_text(info.value) and "w0rd" not in _full_text(info.value)
    assert shown in str(info.value)


def test_missing_driver_is_a_state_store_error() -> None:
    assert importlib.util.find_spec("pg8000") is None, "this test needs pg8000 to be absent"
    with pytest.raises(StateStoreError, match=r"driver .*pg8000.* is not installed") as info:
        StateStore("postgresql+pg8000://u:s3cret@127.0.0.1:1/db")
    assert "s3cret" not in _full_text(info.value)


def test_store_shows_a_safe_url_and_connects_with_the_real_one(postgres_url: str) -> None:
    store = StateStore(postgres_url)
    password = postgres_url.split(":", 2)[2].split("@", 1)[0]
    assert store.url == postgres_url
    assert password not in store.safe_url and ":***@127.0.0.1" in store.safe_url
    store.start_run("r1", "scheduled")
    assert [r.run_id for r in store.runs()] == ["r1"]
    store.dispose()


def test_set_pins_replaces_all_pins_of_one_holder_at_once(store: StateStore) -> None:
    store.set_pins("ssbj.a", {"/w/m": [3, 1], "/w/pending": [7]})
    store.set_pins("audit.out", {"/w/m": [1], "/w/silver": [4]})
    assert store.pins_of("ssbj.a") == {"/w/m": [1, 3], "/w/pending": [7]}
    assert store.pinned_versions("/w/m") == [1, 3]

    # A new set drops what it no longer names (table and version) and adds the rest.
    store.set_pins("ssbj.a", {"/w/m": range(3, 6)})
    assert store.pins_of("ssbj.a") == {"/w/m": [3, 4, 5]}
    assert store.pins_of("audit.out") == {"/w/m": [1], "/w/silver": [4]}
    assert store.pinned_versions("/w/m") == [1, 3, 4, 5]
    assert store.pinned_versions("/w/pending") == []

    store.set_pins("ssbj.a", {})
    assert store.pins_of("ssbj.a") == {}
    assert store.pinned_versions("/w/m") == [1]

    with pytest.raises(StateStoreError, match=r"versions are >= 0, got \[\('/w/m', -1\)\]"):
        store.set_pins("audit.out", {"/w/m": [2, -1]})
    assert store.pins_of("audit.out") == {"/w/m": [1], "/w/silver": [4]}  # nothing changed


def test_a_state_is_saved_and_a_step_completed_with_its_pins_in_one_transaction(
    store: StateStore,
) -> None:
    """A plan's state and its pins land together, and so do a completed step's offset,
    state and pins: a failure in either half leaves both as they were."""
    store.save_operator_state("a", {"plan": 1}, pins=("ssbj.a", {"/w/m": [2, 3]}))
    assert store.operator_state("a") == {"plan": 1}
    assert store.pins_of("ssbj.a") == {"/w/m": [2, 3]}

    with pytest.raises(TypeError):  # the state is not JSON: the pins stay too
        store.save_operator_state("a", {"plan": object()}, pins=("ssbj.a", {"/w/m": [9]}))
    assert store.pins_of("ssbj.a") == {"/w/m": [2, 3]}
    with pytest.raises(StateStoreError, match=">= 0"):  # a bad pin: the state stays
        store.save_operator_state("a", {"plan": 2}, pins=("ssbj.a", {"/w/m": [-1]}))
    assert store.operator_state("a") == {"plan": 1}

    store.complete_step("a", 5, 1, {"next_step": 1}, pins=("ssbj.a", {"/w/m": [3]}))
    assert store.offset("a").input_version == 5 and store.offset("a").step_seq == 1
    assert store.operator_state("a") == {"next_step": 1}
    assert store.pins_of("ssbj.a") == {"/w/m": [3]}
    with pytest.raises(TypeError):
        store.complete_step("a", 6, 2, {"next_step": object()}, pins=("ssbj.a", {"/w/m": [4]}))
    assert store.offset("a").input_version == 5
    assert store.pins_of("ssbj.a") == {"/w/m": [3]}


def _plan_complete_and_measure(store: StateStore) -> None:
    """A stage's per-step writes (plan with pins, completion with pins, metrics), as the
    SSBJ controller makes them, read back through the store."""
    plan = {"next_step": 1, "plan": {"step": 0}, "ratio": float("nan"), "nested": {"a": [1, 2]}}
    store.save_operator_state("s", plan, pins=("ssbj.s", {"/w/in": [0, 1], "/w/m": [4]}))
    saved = store.operator_state("s")
    assert saved is not None and math.isnan(saved.pop("ratio"))
    assert saved == {k: v for k, v in plan.items() if k != "ratio"}
    assert store.pins_of("ssbj.s") == {"/w/in": [0, 1], "/w/m": [4]}
    assert store.offset("s").input_version == 0

    done = {"next_step": 1, "plan": None, "chunks": {"0": 4}}
    store.complete_step("s", 1, 1, done, pins=("ssbj.s", {"/w/in": [1], "/w/m": [4, 5]}))
    offset = store.offset("s")
    assert (offset.input_version, offset.step_seq) == (1, 1)
    assert offset.planned_input_version is None and offset.planned_master_version is None
    assert offset.updated_at.tzinfo is not None
    assert store.operator_state("s") == done
    assert store.pins_of("ssbj.s") == {"/w/in": [1], "/w/m": [4, 5]}

    offset, state = store.stage_progress("s")  # both, in one transaction
    assert (offset.input_version, offset.step_seq, state) == (1, 1, done)
    fresh, nothing = store.stage_progress("never-ran")
    assert (fresh.input_version, fresh.step_seq, nothing) == (0, 0, None)

    store.complete_step("s", 3, 2, {"next_step": 2}, pins=("ssbj.s", {}))
    assert (store.offset("s").input_version, store.offset("s").step_seq) == (3, 2)
    assert store.pins_of("ssbj.s") == {}

    store.record_metrics("r1", "s", 1, {"tuples_in": 5, "seconds": 0.25})
    recorded = {(m.step, m.name): m.value for m in store.metrics("r1")}
    assert recorded == {(1, "tuples_in"): 5.0, (1, "seconds"): 0.25}
    assert all(m.recorded_at.tzinfo is not None for m in store.metrics("r1"))

    # A step's metrics recorded with its completion, in its transaction: a completion
    # that fails (a metric that is no number) leaves neither.
    store.complete_step(
        "s", 4, 3, {"next_step": 3}, metrics=StepMetricValues("r2", 3, {"tuples_in": 7})
    )
    assert [(m.stage, m.step, m.name, m.value) for m in store.metrics("r2")] == [
        ("s", 3, "tuples_in", 7.0)
    ]
    assert store.offset("s").step_seq == 3
    with pytest.raises(ValueError, match="could not convert"):
        store.complete_step(
            "s",
            5,
            4,
            {"next_step": 4},
            metrics=StepMetricValues("r2", 4, {"bad": "x"}),  # type: ignore[dict-item]
        )
    assert len(store.metrics("r2")) == 1
    assert (store.offset("s").input_version, store.offset("s").step_seq) == (4, 3)
    assert store.operator_state("s") == {"next_step": 3}


def test_a_step_is_planned_completed_and_measured(store: StateStore) -> None:
    _plan_complete_and_measure(store)


def _interval(
    start: datetime, tuples: int, waiting: int, run_id: str, completed_at: datetime | None = None
) -> IntervalRecord:
    complete = completed_at is not None
    return IntervalRecord(
        "out",
        start,
        start + timedelta(hours=1),
        tuples,
        waiting,
        0,
        None if complete else start + timedelta(minutes=70),
        complete,
        completed_at,
        run_id if complete else None,
        run_id,
    )


def test_interval_completeness_is_replaced_by_table_and_interval_with_its_progress_and_pins(
    store: StateStore,
) -> None:
    """Each (table, interval) is one row that a later record replaces; the records, the
    progress state and the pins land in one transaction (a bad pin keeps all three)."""
    hour = datetime(2024, 1, 1, tzinfo=UTC)
    first = [_interval(hour, 10, 5, "r1"), _interval(hour + timedelta(hours=1), 4, 4, "r1")]
    store.save_completeness(first, ("completeness.out", {"counted_version": 3}), ("c.out", {}))
    assert store.interval_records("out") == first[::-1]  # newest interval first
    done_at = hour + timedelta(hours=2, minutes=5)
    second = [_interval(hour, 10, 0, "r2", done_at)]
    store.save_completeness(
        second, ("completeness.out", {"counted_version": 4}), ("c.out", {"/w/bronze": [4]})
    )
    assert store.interval_records("out") == [first[1], second[0]]
    assert store.operator_state("completeness.out") == {"counted_version": 4}
    assert store.pins_of("c.out") == {"/w/bronze": [4]}
    (back,) = store.interval_records("out", latest=1, since=hour, until=hour + timedelta(hours=1))
    assert back.completed_at == done_at and back.completed_at.tzinfo is not None
    assert store.interval_records("out", incomplete=True) == [first[1]]
    # The open intervals and those asked for, as an evaluation loads them.
    assert store.interval_records("out", starts=[hour]) == [first[1], second[0]]
    assert store.interval_records("out", latest=1) == [first[1]]
    assert store.intervals_completed_by("r2", "out") == second
    assert store.intervals_completed_by("r1", "out") == []
    assert store.interval_records("other") == []

    with pytest.raises(StateStoreError, match=">= 0"):
        store.save_completeness(
            [_interval(hour, 11, 1, "r3")],
            ("completeness.out", {"counted_version": 5}),
            ("c.out", {"/w/bronze": [-1]}),
        )
    assert store.interval_records("out") == [first[1], second[0]]
    assert store.operator_state("completeness.out") == {"counted_version": 4}


def test_a_store_without_the_completeness_table_gains_it_when_opened(
    state_store_url: str,
) -> None:
    """interval_completeness came after schema version 2: opening a store written before it
    creates the table, and keeps the rest."""
    store = StateStore(state_store_url)
    store.start_run("r1", "scheduled")
    with store._engine.begin() as connection:
        connection.execute(text("DROP TABLE interval_completeness"))
    store.dispose()
    reopened = StateStore(state_store_url)
    hour = datetime(2024, 1, 1, tzinfo=UTC)
    reopened.save_completeness([_interval(hour, 1, 1, "r1")], ("k", {}), ("h", {}))
    assert [r.tuples for r in reopened.interval_records("out")] == [1]
    assert [r.run_id for r in reopened.runs()] == ["r1"]
    reopened.dispose()


def test_recent_step_metrics_read_the_latest_steps_of_one_stage(store: StateStore) -> None:
    for step in range(1, 6):
        store.record_metrics("r1", "enrich", step, {"step_seconds": step, "tuples_in": 10})
    store.record_metrics("r1", "other", 1, {"step_seconds": 99.0})
    store.record_metrics("r2", "enrich", 5, {"step_seconds": 7.0, "cache_hits": 1.0})
    recent = store.recent_step_metrics("enrich", ("step_seconds", "cache_hits"), limit=4)
    # Newest first; a step recorded again (a rerun) is read as its latest record; at most
    # ``limit`` rows, of the names asked for only.
    assert [(m.run_id, m.step, dict(m.values)) for m in recent] == [
        ("r2", 5, {"cache_hits": 1.0, "step_seconds": 7.0}),
        ("r1", 5, {"step_seconds": 5.0}),
        ("r1", 4, {"step_seconds": 4.0}),
    ]
