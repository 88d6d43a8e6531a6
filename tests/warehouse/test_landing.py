"""Landing-zone ingestion: complete files only, once each, bad records quarantined."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from common.errors import ConfigError
from pipeline.config import ColumnSpec, StreamConfig
from pipeline.runner import stream_source
from tests.helpers import assert_same_multiset
from warehouse import bronze_load, landing_local
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.landing import (
    IngestReport,
    ingest_stream,
    rejected_files_in_place,
)
from warehouse.state_store import StateStore
from warehouse.state_tables import LandingFile

COLUMNS = [
    ColumnSpec(name="id", type="bigint", nullable=False),
    ColumnSpec(name="k", type="bigint"),
    ColumnSpec(name="label", type="string"),
    ColumnSpec(name="ts", type="timestamp", nullable=False),
]


class Harness:
    def __init__(
        self, spark: SparkSession, root: Path, fmt: str, landing_name: str = "landing"
    ) -> None:
        self.spark = spark
        self.landing = root / landing_name
        self.landing.mkdir(parents=True)
        stream = StreamConfig(
            landing=str(self.landing), format=fmt, columns=COLUMNS, event_time="ts", id_column="id"
        )
        # Without the id lookup: these tests are of files; record_identity's test turns it on.
        self.source = dataclasses.replace(
            stream_source("s", stream, str(root / "bronze"), str(root / "quarantine")),
            id_column=None,
        )
        self.engine = EmbeddedDeltaEngine(spark)
        self.store = StateStore(f"sqlite:///{root / 'state.db'}")
        self.runs = 0

    def ingest(self) -> IngestReport:
        self.runs += 1
        run_id = f"run{self.runs}"
        self.store.start_run(run_id, "ingest")
        return ingest_stream(self.spark, self.engine, self.store, self.source, run_id)

    def bronze(self) -> list[tuple]:
        return [tuple(r)[:3] for r in self.engine.read(self.source.bronze_path).collect()]

    def quarantine(self) -> list[tuple]:
        frame = self.engine.read(self.source.quarantine_path)
        return [(r.source_file, r.reason, r.record) for r in frame.collect()]

    def bronze_by_file(self) -> list[tuple]:
        frame = self.engine.read(self.source.bronze_path)
        return [(Path(r._source_file).name, r.id) for r in frame.collect()]

    def entry(self, name: str) -> LandingFile:
        found = self.store.landing_file("s", str(self.landing / name))
        assert found is not None, f"{name} is not in the ledger"
        return found

    def staged(self) -> list[Path]:
        staging = self.landing / "_staging"
        return sorted(staging.iterdir()) if staging.exists() else []


def json_lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def good(i: int) -> dict:
    return {"id": i, "k": i % 3, "label": f"l{i}", "ts": "2024-01-01T00:00:00Z"}


@pytest.fixture
def json_harness(spark: SparkSession, tmp_path: Path) -> Harness:
    return Harness(spark, tmp_path, "json")


def test_in_progress_files_are_ignored(json_harness: Harness) -> None:
    h = json_harness
    (h.landing / "_writing.json").write_text(json_lines([good(1)]))
    (h.landing / ".hidden.json").write_text(json_lines([good(2)]))
    (h.landing / "_tmp").mkdir()
    (h.landing / "_tmp" / "inner.json").write_text(json_lines([good(3)]))
    (h.landing / "ready.json").write_text(json_lines([good(4)]))
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded) == (1, 1)
    assert_same_multiset(h.bronze(), [(4, 1, "l4")])


def test_redelivered_identical_file_is_skipped(json_harness: Harness) -> None:
    h = json_harness
    (h.landing / "a.json").write_text(json_lines([good(1), good(2)]))
    assert h.ingest().files_loaded == 1
    os.utime(h.landing / "a.json")  # touched, same content
    second = h.ingest()
    assert (second.files_loaded, second.files_skipped, second.errors) == (0, 1, [])
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2")])


def test_changed_file_under_known_name_is_an_error(json_harness: Harness) -> None:
    h = json_harness
    (h.landing / "a.json").write_text(json_lines([good(1)]))
    h.ingest()
    (h.landing / "a.json").write_text(json_lines([good(1), good(99)]))
    (h.landing / "b.json").write_text(json_lines([good(5)]))
    report = h.ingest()
    assert len(report.errors) == 1 and "content changed since it was registered" in report.errors[0]
    assert report.files_loaded == 1  # b.json still loads; nothing of the changed a.json does
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (5, 2, "l5")])
    assert (h.landing / "a.json").exists()


def test_malformed_json_records_are_quarantined_with_reason(json_harness: Harness) -> None:
    h = json_harness
    bad_lines = [
        '{"id": 10, "k": 1, "label": "x", "ts": "2024-01-01T00:00:00Z"',  # truncated
        '{"id": "eleven", "k": 1, "label": "x", "ts": "2024-01-01T00:00:00Z"}',  # wrong type
        "not json at all",
        json.dumps({"id": None, "k": 1, "label": "x", "ts": "2024-01-01T00:00:00Z"}),  # null key
        json.dumps({"id": 14, "k": 1, "label": "x"}),  # missing required ts
    ]
    content = json_lines([good(1), good(2)]) + "\n".join(bad_lines) + "\n" + json_lines([good(3)])
    (h.landing / "mixed.json").write_text(content)
    report = h.ingest()
    assert (report.records_received, report.records_loaded, report.records_quarantined) == (8, 3, 5)
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2"), (3, 0, "l3")])
    quarantined = h.quarantine()
    assert len(quarantined) == 5
    assert {q[0] for q in quarantined} == {str(h.landing / "mixed.json")}
    reasons = sorted(q[1] for q in quarantined)
    assert reasons.count("malformed: does not parse against the declared schema") == 3
    assert (
        "null in required column(s): id" in reasons and "null in required column(s): ts" in reasons
    )
    assert any("not json at all" in q[2] for q in quarantined)
    loaded = h.store.landing_file("s", str(h.landing / "mixed.json"))
    assert loaded is not None and (loaded.records_quarantined, loaded.status) == (5, "loaded")


def test_malformed_csv_records_are_quarantined(spark: SparkSession, tmp_path: Path) -> None:
    h = Harness(spark, tmp_path, "csv")
    lines = [
        "id,k,label,ts",
        "1,1,a,2024-01-01 00:00:00",
        "2,x,b,2024-01-01 00:00:00",  # k not a number
        "3,1,c,2024-01-01 00:00:00,extra",  # too many fields
        "4,1",  # too few fields
        "5,2,e,2024-01-01 00:00:00",
        ",2,f,2024-01-01 00:00:00",  # null id
    ]
    (h.landing / "b.csv").write_text("\n".join(lines) + "\n")
    report = h.ingest()
    assert (report.records_received, report.records_loaded, report.records_quarantined) == (6, 2, 4)
    assert_same_multiset(h.bronze(), [(1, 1, "a"), (5, 2, "e")])
    assert len(h.quarantine()) == 4


@pytest.mark.parametrize(
    ("fmt", "name", "content", "detail"),
    [
        ("json", "extra.json", json_lines([{**good(1), "surprise": 1}]), "unexpected ['surprise']"),
        # A line Arrow's reader refuses: the keys are checked by the Spark job instead.
        (
            "json",
            "extra_and_bad.json",
            json_lines([{**good(1), "surprise": 1}]) + "garbage\n",
            "unexpected ['surprise']",
        ),
        ("json", "no_ts.json", json_lines([{"id": 1, "k": 1, "label": "a"}]), "missing ['ts']"),
        (
            "csv",
            "renamed.csv",
            "id,key,label,ts\n1,1,a,2024-01-01 00:00:00\n",
            "unexpected ['key']",
        ),
    ],
)
def test_schema_drift_rejects_the_whole_file(
    spark: SparkSession, tmp_path: Path, fmt: str, name: str, content: str, detail: str
) -> None:
    h = Harness(spark, tmp_path, fmt)
    (h.landing / name).write_text(content)
    report = h.ingest()
    assert (report.files_rejected, report.files_loaded) == (1, 0)
    assert detail in report.errors[0] and "left in place" in report.errors[0]
    assert h.bronze() == [] and h.quarantine() == []
    assert (h.landing / name).exists()
    entry = h.store.landing_file("s", str(h.landing / name))
    assert entry is not None and entry.status == "rejected" and detail in (entry.error or "")


def test_parquet_with_wrong_types_is_rejected(spark: SparkSession, tmp_path: Path) -> None:
    h = Harness(spark, tmp_path, "parquet")
    schema = T.StructType(
        [
            T.StructField("id", T.StringType()),
            T.StructField("k", T.LongType()),
            T.StructField("label", T.StringType()),
            T.StructField("ts", T.TimestampType()),
        ]
    )
    frame = spark.createDataFrame([("1", 1, "a", dt.datetime(2024, 1, 1))], schema).toPandas()
    frame.to_parquet(h.landing / "p.parquet")
    report = h.ingest()
    assert report.files_rejected == 1
    assert "id: declared bigint, file has string" in report.errors[0]


def fail_appends_to(table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every append to a table whose path ends with ``table`` dies before it commits."""
    real_append = EmbeddedDeltaEngine.append

    def append(self: EmbeddedDeltaEngine, path: str, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        if path.endswith(table):
            raise OSError(f"killed before the {table} commit")
        return real_append(self, path, *args, **kw)

    monkeypatch.setattr(EmbeddedDeltaEngine, "append", append)


def ingest_killed_after_the_bronze_commit(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """One ingest that dies at its first quarantine append, after the bronze commit."""
    fail_appends_to("quarantine", monkeypatch)
    with pytest.raises(OSError, match="killed"):
        h.ingest()
    monkeypatch.undo()


def test_crash_between_commits_resumes_without_duplicates(
    json_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = json_harness
    (h.landing / "a.json").write_text(json_lines([good(1), good(2)]) + "garbage\n")
    ingest_killed_after_the_bronze_commit(h, monkeypatch)
    entry = h.store.landing_file("s", str(h.landing / "a.json"))
    assert entry is not None and entry.status == "registered"
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded, report.records_quarantined) == (1, 2, 1)
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2")])
    assert len(h.quarantine()) == 1


# ------------------------------------------------------------------ file names are not patterns


def test_glob_characters_in_file_names_are_read_literally(json_harness: Harness) -> None:
    h = json_harness
    names = {"o1.json": 1, "o[1].json": 2, "o?.json": 3, "o{1,2}.json": 4, "o*.json": 5}
    for name, i in names.items():
        (h.landing / name).write_text(json_lines([good(i), good(10 * i)]))
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded, report.errors) == (5, 10, [])
    assert_same_multiset(
        h.bronze_by_file(), [(name, r) for name, i in names.items() for r in (i, 10 * i)]
    )
    assert h.staged() == []  # each staging copy is deleted once its file is loaded


@pytest.mark.parametrize("landing_name", ["land[1]", "land{a,b}", "land*"])
def test_landing_directory_with_glob_characters_is_refused(
    spark: SparkSession, tmp_path: Path, landing_name: str
) -> None:
    h = Harness(spark, tmp_path, "json", landing_name)
    (h.landing / "a.json").write_text(json_lines([good(1)]))
    with pytest.raises(ConfigError, match="glob"):
        h.ingest()
    assert h.store.landing_files("s") == []


# ------------------------------------------------------------------ one bad file blocks nothing


CSV_HEADER = "id,k,label,ts\n"


@pytest.mark.parametrize(
    ("fmt", "bad"),
    [
        ("csv", b"id,k,label\xe9,ts\n1,1,a,2024-01-01 00:00:00\n"),  # Latin-1 in the header
        ("csv", b"id,k,label,ts\n1,1,caf\xe9,2024-01-01 00:00:00\n"),  # ... in a record
        ("json", b'{"id": 1, "k": 1, "label": "caf\xe9", "ts": "2024-01-01T00:00:00Z"}\n'),
    ],
)
def test_file_that_is_not_utf8_is_rejected_and_siblings_load(
    spark: SparkSession, tmp_path: Path, fmt: str, bad: bytes
) -> None:
    h = Harness(spark, tmp_path, fmt)
    (h.landing / f"bad.{fmt}").write_bytes(bad)
    sibling = CSV_HEADER + "2,2,l2,2024-01-01 00:00:00\n" if fmt == "csv" else json_lines([good(2)])
    (h.landing / f"good.{fmt}").write_text(sibling)
    report = h.ingest()
    assert (report.files_loaded, report.files_rejected) == (1, 1)
    assert_same_multiset(h.bronze(), [(2, 2, "l2")])  # no U+FFFD row slipped in
    (error,) = report.errors
    assert "not valid UTF-8" in error and f"byte {bad.index(0xE9)}" in error
    entry = h.entry(f"bad.{fmt}")
    assert entry.status == "rejected" and "not valid UTF-8" in (entry.error or "")
    assert (h.landing / f"bad.{fmt}").read_bytes() == bad  # left in place, untouched
    assert h.staged() == []


def test_utf8_check_finds_the_offset_across_block_boundaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landing_local, "BLOCK_BYTES", 3)  # split multi-byte characters
    text = "naïve café – ☕ 𝄞".encode()
    ok = tmp_path / "ok.csv"
    ok.write_bytes(text)
    copy = tmp_path / "copy"
    read = landing_local._read_file(ok, copy, check_utf8=True)
    assert read.bad_utf8_at is None and copy.read_bytes() == text
    assert read.sha256 == hashlib.sha256(text).hexdigest()
    for bad in (text[:7] + b"\xe9" + text[7:], text[:-1]):  # a Latin-1 byte; a cut 𝄞
        path = tmp_path / "bad.csv"
        path.write_bytes(bad)
        expected = 7 if len(bad) > len(text) else len(text) - 4
        assert landing_local._read_file(path, None, check_utf8=True).bad_utf8_at == expected


def write_parquet(path: Path, ids: list[int], *, padding: int = 0) -> None:
    table = pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([i % 3 for i in ids], pa.int64()),
            "label": pa.array([f"l{i}" + "x" * padding for i in ids], pa.string()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC)] * len(ids), pa.timestamp("us", tz="UTC")
            ),
        }
    )
    pq.write_table(table, path, compression="snappy")


@pytest.mark.parametrize("damage", ["empty", "not parquet", "corrupt pages"])
def test_unreadable_parquet_is_rejected_and_siblings_load(
    spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    h = Harness(spark, tmp_path, "parquet")
    bad = h.landing / "bad.parquet"
    if damage == "empty":
        bad.write_bytes(b"")
    elif damage == "not parquet":
        bad.write_bytes(b"PAR1 this is not a parquet file PAR1")
    else:  # a readable footer over data pages that do not decompress
        write_parquet(bad, list(range(1000)), padding=40)
        raw = bytearray(bad.read_bytes())
        raw[64:2048] = b"\x55" * (2048 - 64)
        bad.write_bytes(bytes(raw))
    write_parquet(h.landing / "good.parquet", [2])
    report = h.ingest()
    assert (report.files_loaded, report.files_rejected) == (1, 1)
    assert_same_multiset(h.bronze(), [(2, 2, "l2")])
    (error,) = report.errors
    assert "bad.parquet" in error and "cannot be read as Parquet" in error
    assert h.entry("bad.parquet").status == "rejected" and bad.exists()
    assert h.staged() == []


def test_registered_file_that_vanished_is_marked_missing_and_reported_once(
    json_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = json_harness
    gone = h.landing / "gone.json"
    gone.write_text(json_lines([good(1)]))
    fail_appends_to("bronze", monkeypatch)
    with pytest.raises(OSError, match="killed"):
        h.ingest()
    monkeypatch.undo()
    assert h.entry("gone.json").status == "registered"
    gone.unlink()
    (h.landing / "b.json").write_text(json_lines([good(2)]))
    report = h.ingest()
    assert report.files_loaded == 1 and report.files_missing == 1
    assert_same_multiset(h.bronze(), [(2, 2, "l2")])
    (error,) = report.errors
    assert "gone.json" in error and "vanished before it was loaded" in error
    missing = h.entry("gone.json")
    assert missing.status == "missing" and "vanished" in (missing.error or "")
    assert h.ingest().errors == []  # reported once, not retried
    # Nothing of it was committed, so a re-delivery under the same name is a new file.
    gone.write_text(json_lines([good(1)]))
    again = h.ingest()
    assert (again.files_loaded, again.errors) == (1, [])
    assert h.entry("gone.json").id > h.entry("b.json").id
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2")])


def test_file_held_back_behind_a_later_batch_is_rejected_not_skipped(
    json_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = json_harness
    original = json_lines([good(1)])
    (h.landing / "a.json").write_text(original)
    fail_appends_to("bronze", monkeypatch)
    with pytest.raises(OSError, match="killed"):
        h.ingest()
    monkeypatch.undo()
    (h.landing / "a.json").write_text(json_lines([good(1), good(7)]))  # changed while in flight
    (h.landing / "b.json").write_text(json_lines([good(2)]))
    changed = h.ingest()
    assert changed.files_loaded == 1 and "content changed" in changed.errors[0]
    (h.landing / "a.json").write_text(original)  # restored: its ledger id is now behind b's
    report = h.ingest()
    # Bronze already records b's later transaction, so a commit under a's id would be
    # skipped as "already done": the file must be rejected, never marked loaded.
    assert (report.files_loaded, report.files_rejected) == (0, 1)
    assert "later batch" in report.errors[0]
    assert h.entry("a.json").status == "rejected"
    assert_same_multiset(h.bronze(), [(2, 2, "l2")])


# ------------------------------------------------------------------ symlinks


def test_symlinks_and_special_files_are_refused(json_harness: Harness, tmp_path: Path) -> None:
    h = json_harness
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json_lines([good(99)]))
    (outside / "inner.json").write_text(json_lines([good(98)]))
    (h.landing / "ok.json").write_text(json_lines([good(1)]))
    (h.landing / "link.json").symlink_to(outside / "secret.json")
    (h.landing / "linkdir").symlink_to(outside, target_is_directory=True)
    (h.landing / "alias.json").symlink_to(h.landing / "ok.json")  # even inside the zone
    os.mkfifo(h.landing / "pipe.json")
    report = h.ingest()
    assert (report.files_loaded, report.files_rejected) == (1, 4)
    assert_same_multiset(h.bronze(), [(1, 1, "l1")])
    for name, reason in [
        ("link.json", "symlink"),
        ("linkdir", "symlink"),
        ("alias.json", "symlink"),
        ("pipe.json", "not a regular file"),
    ]:
        entry = h.entry(name)
        assert entry.status == "rejected" and reason in (entry.error or ""), entry.error
        assert any(name in e and reason in e for e in report.errors)
    assert len(report.errors) == 4
    assert (h.landing / "link.json").is_symlink()  # left in place


# ------------------------------------------------------------------ duplicates


def test_same_content_under_a_new_name_is_not_loaded_again(
    json_harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = json_harness
    content = json_lines([good(1), good(2)])
    (h.landing / "a.json").write_text(content)
    assert h.ingest().files_loaded == 1
    (h.landing / "a-copy.json").write_text(content)
    (h.landing / "c.json").write_text(json_lines([good(3)]))
    (h.landing / "c-twin.json").write_text(json_lines([good(3)]))  # twins in one delivery
    with caplog.at_level(logging.WARNING, logger="warehouse.landing"):
        report = h.ingest()
    assert (report.files_loaded, report.files_skipped, report.errors) == (1, 3, [])
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2"), (3, 0, "l3")])
    copy = h.entry("a-copy.json")
    assert copy.status == "duplicate" and str(h.landing / "a.json") in (copy.error or "")
    twins = sorted([h.entry("c.json"), h.entry("c-twin.json")], key=lambda e: e.id)
    assert [t.status for t in twins] == ["loaded", "duplicate"]
    assert twins[0].path in (twins[1].error or "")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and all("same content as" in w for w in warned)
    later = h.ingest()
    assert (later.files_loaded, later.files_skipped, later.errors) == (0, 4, [])


# ------------------------------------------------------------------ rejected files stay loud


def test_rejected_file_is_reported_until_it_is_moved_away(
    json_harness: Harness, tmp_path: Path
) -> None:
    h = json_harness
    drift = h.landing / "drift.json"
    drift.write_text(json_lines([{**good(1), "surprise": 1}]))
    (h.landing / "ok.json").write_text(json_lines([good(2)]))
    first = h.ingest()
    assert (first.files_loaded, first.files_rejected, len(first.errors)) == (1, 1, 1)
    for _ in range(2):
        again = h.ingest()
        assert (again.files_loaded, again.files_rejected, again.files_rejected_in_place) == (
            0,
            0,
            1,
        )
        (error,) = again.errors
        assert "drift.json" in error and "still in the landing zone" in error
        assert "unexpected ['surprise']" in error
    assert [e.path for e in rejected_files_in_place(h.store, "s")] == [str(drift)]
    drift.rename(tmp_path / "drift.json")
    cleared = h.ingest()
    assert (cleared.errors, cleared.files_rejected_in_place) == ([], 0)
    assert rejected_files_in_place(h.store, "s") == []


def test_rejected_file_corrected_in_place_is_loaded_under_a_new_ledger_id(
    json_harness: Harness,
) -> None:
    h = json_harness
    (h.landing / "a.json").write_text(json_lines([{**good(1), "surprise": 1}]))
    assert h.ingest().files_rejected == 1
    (h.landing / "b.json").write_text(json_lines([good(2)]))
    assert h.ingest().files_loaded == 1  # b commits under a later ledger id than a's
    (h.landing / "a.json").write_text(json_lines([good(1)]))
    report = h.ingest()
    assert (report.files_loaded, report.errors) == (1, [])
    entry = h.entry("a.json")
    assert entry.status == "loaded" and entry.id > h.entry("b.json").id
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2")])


# ------------------------------------------------------------------ files that share a commit


def parquet_harness(spark: SparkSession, root: Path) -> Harness:
    """Parquet files with the id lookup on: their ids come from the footers' statistics."""
    h = Harness(spark, root, "parquet")
    h.source = dataclasses.replace(h.source, id_column="id")
    return h


def bronze_commits(h: Harness) -> int:
    """Appends to bronze: its versions after 0, the table's creation."""
    return h.engine.snapshot(h.source.bronze_path).version


def test_parquet_files_of_disjoint_ids_share_one_bronze_commit(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = parquet_harness(spark, tmp_path)
    for name, ids in (("a", [1, 2]), ("b", [3, 4]), ("c", [5])):
        write_parquet(h.landing / f"{name}.parquet", ids)
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded) == (3, 5)
    assert bronze_commits(h) == 1
    assert sorted(h.bronze_by_file()) == [
        ("a.parquet", 1),
        ("a.parquet", 2),
        ("b.parquet", 3),
        ("b.parquet", 4),
        ("c.parquet", 5),
    ]
    assert [h.entry(f"{n}.parquet").records_loaded for n in "abc"] == [2, 2, 1]
    assert {h.entry(f"{n}.parquet").status for n in "abc"} == {"loaded"}


def test_files_whose_ids_overlap_commit_apart_and_the_re_sent_record_is_found(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = parquet_harness(spark, tmp_path)
    write_parquet(h.landing / "a.parquet", [1, 2])
    write_parquet(h.landing / "b.parquet", [2, 3])  # id 2 again, the same content
    write_parquet(h.landing / "c.parquet", [4])
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded, report.records_resent) == (3, 4, 1)
    assert bronze_commits(h) == 2  # a alone; b and c together
    assert sorted(r[0] for r in h.bronze()) == [1, 2, 3, 4]
    assert h.entry("b.parquet").records_resent == 1


def test_a_crash_after_a_shared_commit_resumes_without_duplicates(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = parquet_harness(spark, tmp_path)
    write_parquet(h.landing / "a.parquet", [1])
    write_parquet(h.landing / "b.parquet", [2, 3])
    write_parquet(h.landing / "c.parquet", [4])
    real_update = StateStore.update_landing_file

    def killed(self: StateStore, file_id: int, **fields: object) -> None:
        if fields.get("status") == "loaded":
            raise OSError("killed after the shared bronze commit")
        real_update(self, file_id, **fields)  # type: ignore[arg-type]

    monkeypatch.setattr(StateStore, "update_landing_file", killed)
    with pytest.raises(OSError, match="killed"):
        h.ingest()
    monkeypatch.undo()
    assert bronze_commits(h) == 1
    assert {h.entry(f"{n}.parquet").status for n in "abc"} == {"registered"}
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded, report.files_rejected) == (3, 4, 0)
    assert bronze_commits(h) == 1  # nothing written again
    assert sorted(r[0] for r in h.bronze()) == [1, 2, 3, 4]
    assert {h.entry(f"{n}.parquet").status for n in "abc"} == {"loaded"}


def test_a_shared_commit_counts_and_quarantines_each_file_of_its_own(
    spark: SparkSession, tmp_path: Path
) -> None:
    """One scan for the group, yet each file keeps its own counts and quarantine rows: a
    re-sent record in one, a null required value in another, a clean third."""
    h = parquet_harness(spark, tmp_path)
    write_parquet(h.landing / "a.parquet", [1, 2])
    assert h.ingest().files_loaded == 1
    write_parquet(h.landing / "b.parquet", [2, 3])  # id 2 re-sent with the same content
    with_null = pa.table(
        {
            "id": pa.array([4, 5], pa.int64()),
            "k": pa.array([1, 2], pa.int64()),
            "label": pa.array(["l4", "l5"], pa.string()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, tzinfo=dt.UTC), None], pa.timestamp("us", tz="UTC")
            ),
        }
    )
    pq.write_table(with_null, h.landing / "c.parquet")
    write_parquet(h.landing / "d.parquet", [6])
    report = h.ingest()
    assert (report.files_loaded, report.records_received, report.records_loaded) == (3, 5, 3)
    assert (report.records_quarantined, report.records_resent) == (1, 1)
    assert bronze_commits(h) == 2  # a's, then b, c and d in one
    assert sorted(h.bronze_by_file()) == [
        ("a.parquet", 1),
        ("a.parquet", 2),
        ("b.parquet", 3),
        ("c.parquet", 4),
        ("d.parquet", 6),
    ]
    counts = {
        n: (e.records_received, e.records_loaded, e.records_quarantined, e.records_resent)
        for n in "bcd"
        for e in [h.entry(f"{n}.parquet")]
    }
    assert counts == {"b": (2, 1, 0, 1), "c": (2, 1, 1, 0), "d": (1, 1, 0, 0)}
    reasons = sorted((Path(f).name, r.split(":")[0]) for f, r, _ in h.quarantine())
    assert reasons == [("b.parquet", "re-sent"), ("c.parquet", "null in required column(s)")]


@pytest.mark.parametrize("route", ["driver", "spark"])
def test_a_clean_group_loads_the_same_rows_whichever_reads_it(
    spark: SparkSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    route: str,
) -> None:
    """A group with nothing to split is read by pyarrow in the driver; too big a group, by
    Spark. Either way bronze holds each file's records as the file has them (timestamps
    with and without a zone, a null in a column that may be null), stamped with the file."""
    if route == "spark":
        monkeypatch.setattr(bronze_load, "DRIVER_GROUP_BYTES", 0)
    h = parquet_harness(spark, tmp_path)
    naive = pa.table(
        {
            "id": pa.array([1, 2], pa.int64()),
            "k": pa.array([None, 7], pa.int64()),
            "label": pa.array(["a", None], pa.string()),
            "ts": pa.array(
                [dt.datetime(2024, 1, 1, 5), dt.datetime(2024, 3, 31, 23, 59, 59, 123456)],
                pa.timestamp("us"),
            ),
        }
    )
    pq.write_table(naive, h.landing / "a.parquet")
    write_parquet(h.landing / "b.parquet", [3, 4])
    with caplog.at_level(logging.INFO, logger="warehouse.landing"):
        report = h.ingest()
    assert ("(read in the driver)" in caplog.text) == (route == "driver")
    assert (report.files_loaded, report.records_loaded, report.records_quarantined) == (2, 4, 0)
    assert bronze_commits(h) == 1

    def utc(ts: dt.datetime) -> dt.datetime:
        return ts if ts.tzinfo is None else ts.astimezone(dt.UTC).replace(tzinfo=None)

    found = sorted(
        (Path(r._source_file).name, r._batch_id, r.id, r.k, r.label, utc(r.ts))
        for r in h.engine.read(h.source.bronze_path).collect()
    )
    a, b = h.entry("a.parquet").id, h.entry("b.parquet").id
    assert found == [
        ("a.parquet", a, 1, None, "a", dt.datetime(2024, 1, 1, 5)),
        ("a.parquet", a, 2, 7, None, dt.datetime(2024, 3, 31, 23, 59, 59, 123456)),
        ("b.parquet", b, 3, 0, "l3", dt.datetime(2024, 1, 1)),
        ("b.parquet", b, 4, 1, "l4", dt.datetime(2024, 1, 1)),
    ]
    assert [h.entry(f"{n}.parquet").records_received for n in "ab"] == [2, 2]
