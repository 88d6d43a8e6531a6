"""A commit file parsed once (``warehouse/delta/commit_file.py``): its rows added, its
commitInfo and its files without data change, from its actions alone."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warehouse.delta.commit_file import CommitFile


def add(path: str, records: int | None, data_change: bool | None = True) -> dict:
    body: dict = {"path": path, "size": 10, "partitionValues": {}}
    if records is not None:
        body["stats"] = json.dumps({"numRecords": records})
    if data_change is not None:
        body["dataChange"] = data_change
    return {"add": body}


def test_the_answers_come_from_the_actions() -> None:
    lines = [
        {"commitInfo": {"operation": "WRITE", "enrichment.operation": "backfill"}},
        add("a.parquet", 3),
        add("b.parquet", 4, data_change=None),  # missing dataChange means true
        add("c.parquet", 5, data_change=False),  # a compaction's file: no new rows
        add("d.parquet", None),  # no statistics: counted as none
        {"remove": {"path": "old.parquet", "dataChange": False}},
        {"remove": {"path": "gone.parquet", "dataChange": True}},
        {"txn": {"appId": "x", "version": 1}},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    commit = CommitFile.parse(7, text)
    assert commit.version == 7 and len(commit.actions) == len(lines)
    assert commit.rows_added == 7
    assert commit.info["enrichment.operation"] == "backfill"
    assert commit.quiet_paths == {"c.parquet", "old.parquet"}


def test_a_commit_without_commit_info_has_an_empty_one() -> None:
    assert CommitFile.parse(0, json.dumps(add("a", 1))).info == {}


def test_a_line_that_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError):
        CommitFile.parse(1, '{"add": {}}\n{not json')


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.sampled_from([True, False, None]))))
def test_rows_added_sums_the_data_changing_adds(adds: list[tuple[int, bool | None]]) -> None:
    text = "\n".join(json.dumps(add(f"f{i}", n, dc)) for i, (n, dc) in enumerate(adds))
    commit = CommitFile.parse(0, text)
    assert commit.rows_added == sum(n for n, dc in adds if dc is not False)
    assert commit.quiet_paths == {f"f{i}" for i, (_, dc) in enumerate(adds) if dc is False}
