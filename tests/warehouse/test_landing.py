"""Landing-zone ingestion: complete files only, once each, bad records quarantined."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from pipeline.config import ColumnSpec, StreamConfig
from pipeline.schemas import QUARANTINE_SCHEMA, bronze_schema, declared_schema
from tests.helpers import assert_same_multiset
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.landing import IngestReport, StreamSource, ingest_stream
from warehouse.state_store import StateStore

COLUMNS = [
    ColumnSpec(name="id", type="bigint", nullable=False),
    ColumnSpec(name="k", type="bigint"),
    ColumnSpec(name="label", type="string"),
    ColumnSpec(name="ts", type="timestamp", nullable=False),
]


class Harness:
    def __init__(self, spark: SparkSession, root: Path, fmt: str) -> None:
        self.spark = spark
        self.landing = root / "landing"
        self.landing.mkdir(parents=True)
        stream = StreamConfig(
            landing=str(self.landing), format=fmt, columns=COLUMNS, event_time="ts", id_column="id"
        )
        self.source = StreamSource(
            name="s",
            landing_dir=self.landing,
            format=fmt,
            schema=declared_schema(COLUMNS),
            required=("id", "ts"),
            bronze_path=str(root / "bronze"),
            quarantine_path=str(root / "quarantine"),
            bronze_schema=bronze_schema(stream),
            quarantine_schema=QUARANTINE_SCHEMA,
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
    import datetime as dt

    frame = spark.createDataFrame([("1", 1, "a", dt.datetime(2024, 1, 1))], schema).toPandas()
    frame.to_parquet(h.landing / "p.parquet")
    report = h.ingest()
    assert report.files_rejected == 1
    assert "id: declared bigint, file has string" in report.errors[0]


def test_crash_between_commits_resumes_without_duplicates(
    json_harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = json_harness
    (h.landing / "a.json").write_text(json_lines([good(1), good(2)]) + "garbage\n")
    real_append = EmbeddedDeltaEngine.append

    def fail_on_quarantine(self: EmbeddedDeltaEngine, path: str, *args: object, **kw: object):  # type: ignore[no-untyped-def]
        if path.endswith("quarantine"):
            raise OSError("killed after the bronze commit")
        return real_append(self, path, *args, **kw)

    monkeypatch.setattr(EmbeddedDeltaEngine, "append", fail_on_quarantine)
    with pytest.raises(OSError, match="killed"):
        h.ingest()
    monkeypatch.undo()
    entry = h.store.landing_file("s", str(h.landing / "a.json"))
    assert entry is not None and entry.status == "registered"
    report = h.ingest()
    assert (report.files_loaded, report.records_loaded, report.records_quarantined) == (1, 2, 1)
    assert_same_multiset(h.bronze(), [(1, 1, "l1"), (2, 2, "l2")])
    assert len(h.quarantine()) == 1
