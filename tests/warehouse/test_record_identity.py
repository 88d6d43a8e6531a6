"""Records re-sent in a new file are loaded once (warehouse.record_identity through ingest)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from tests.helpers import assert_same_multiset
from tests.warehouse.test_landing import (
    Harness,
    good,
    ingest_killed_after_the_bronze_commit,
    json_lines,
)
from warehouse.delta.api import DataFile
from warehouse.delta.native import NativeDeltaEngine
from warehouse.record_identity import CONFLICT, RESENT


def identity_harness(spark: SparkSession, root: Path, fmt: str, engine: str) -> Harness:
    h = Harness(spark, root, fmt)
    h.source = dataclasses.replace(h.source, id_column="id")
    if engine == "native":
        h.engine = NativeDeltaEngine(spark)  # type: ignore[assignment]
    return h


def write(h: Harness, name: str, ids: range, fmt: str, label: str = "l") -> None:
    rows = [{**good(i), "label": f"{label}{i}"} for i in ids]
    if fmt == "json":
        (h.landing / name).write_text(json_lines(rows))
        return
    table = pa.table(
        {
            "id": pa.array([r["id"] for r in rows], pa.int64()),
            "k": pa.array([r["k"] for r in rows], pa.int64()),
            "label": pa.array([r["label"] for r in rows]),
            "ts": pa.array([pa.scalar(0, pa.timestamp("us", "UTC")).as_py()] * len(rows)),
        }
    )
    pq.write_table(table, h.landing / name)


@pytest.mark.parametrize(("fmt", "engine"), [("json", "embedded"), ("parquet", "native")])
def test_records_re_sent_in_a_new_file_are_loaded_once(
    spark: SparkSession, tmp_path: Path, fmt: str, engine: str
) -> None:
    h = identity_harness(spark, tmp_path, fmt, engine)
    write(h, f"a.{fmt}", range(0, 10), fmt)
    assert h.ingest().records_loaded == 10
    # A producer's retry: ids 5-9 again (same content) and 10-14 new, in another file.
    write(h, f"b.{fmt}", range(5, 15), fmt)
    report = h.ingest()
    assert (report.records_received, report.records_loaded, report.records_quarantined) == (
        10,
        5,
        0,
    )
    assert report.records_resent == 5
    assert_same_multiset([(i,) for _, i in h.bronze_by_file()], [(i,) for i in range(15)])
    assert sorted(h.bronze_by_file()) == sorted(
        [("a." + fmt, i) for i in range(10)] + [("b." + fmt, i) for i in range(10, 15)]
    )
    recorded = h.quarantine()
    assert len(recorded) == 5
    for source_file, reason, _ in recorded:
        assert source_file.endswith(f"b.{fmt}")
        assert reason.startswith(RESENT) and f"a.{fmt}" in reason, reason
    entry = h.entry(f"b.{fmt}")
    assert (entry.records_loaded, entry.records_quarantined, entry.records_resent) == (5, 0, 5)


def test_an_id_re_sent_with_other_content_is_quarantined_as_a_conflict(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = identity_harness(spark, tmp_path, "json", "embedded")
    write(h, "a.json", range(0, 4), "json")
    h.ingest()
    write(h, "b.json", range(2, 3), "json")  # id 2, same content
    # An id that is not a number fails its record's parse, not the file's id lookup.
    not_a_number = {**good(0), "id": "x"}
    (h.landing / "c.json").write_text(
        json_lines([{**good(3), "label": "changed"}, good(9), not_a_number])
    )
    # Both files load in one run: c's ids are looked up against a's, and b's.
    report = h.ingest()
    assert (report.records_loaded, report.records_quarantined, report.records_resent) == (1, 2, 1)
    reasons = {(Path(f).name, reason.split(":")[0]): reason for f, reason, _ in h.quarantine()}
    assert reasons[("b.json", RESENT.rstrip(": "))].startswith(RESENT)
    conflict = reasons[("c.json", CONFLICT.rstrip(": "))]
    assert "a.json" in conflict and "id 3 " in conflict
    assert ("c.json", "malformed") in reasons
    # The first content stays; the conflicting record is kept whole in the quarantine.
    assert (3, 0, "l3") in h.bronze() and (9, 0, "l9") in h.bronze()
    assert any('"changed"' in record for _, _, record in h.quarantine())


def test_a_rerun_after_the_bronze_commit_classifies_the_file_the_same_way(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = identity_harness(spark, tmp_path, "json", "embedded")
    write(h, "a.json", range(0, 6), "json")
    h.ingest()
    write(h, "b.json", range(3, 9), "json")
    ingest_killed_after_the_bronze_commit(h, monkeypatch)
    # b's own rows are in bronze now; they must not make b's new ids look re-sent.
    report = h.ingest()
    assert (report.records_loaded, report.records_resent) == (3, 3)
    assert sorted(i for _, i in h.bronze_by_file()) == list(range(9))
    assert len(h.quarantine()) == 3


def test_ids_beyond_every_loaded_file_read_nothing_of_bronze(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = identity_harness(spark, tmp_path, "json", "embedded")
    for index in range(3):
        write(h, f"f{index}.json", range(index * 10, index * 10 + 10), "json")
        h.ingest()
    write(h, "late.json", range(30, 40), "json")
    with caplog.at_level(logging.INFO, logger="warehouse.record_identity"):
        assert h.ingest().records_loaded == 10
    assert "0 of 3 file(s) may hold ids in [30, 39]" in caplog.text


@given(
    values=st.lists(st.integers(-50, 50), min_size=1, max_size=20),
    low=st.integers(-60, 60),
    width=st.integers(0, 30),
)
def test_a_file_is_skipped_only_when_no_value_can_match(
    values: list[int], low: int, width: int
) -> None:
    """DataFile.may_hold: False proves no value lies in [low, high]."""
    high = low + width
    file = DataFile("f", 1, len(values), bounds={"id": (min(values), max(values))})
    if not file.may_hold("id", low, high):
        assert not any(low <= v <= high for v in values)
    assert DataFile("g", 1, None).may_hold("id", low, high)  # no bounds: read
    assert DataFile("h", 1, None, bounds={"id": ("a", "b")}).may_hold("id", low, high)
