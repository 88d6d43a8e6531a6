"""The log writer: a commit file made visible whole or not at all, with actions delta-rs
reads as its own (the engine-level tests in test_engines read the tables it writes)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from hypothesis import given
from hypothesis import strategies as st

from warehouse.delta.commit_file import CommitFile
from warehouse.delta.log_writer import (
    ENGINE_INFO,
    LogFile,
    add_action,
    commit_info_action,
    commit_text,
    log_path,
    remove_action,
    txn_action,
    writable,
    write_commit,
)


def _table(tmp_path: Path) -> str:
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"a": pa.array([1], pa.int64())}))
    return path


def test_a_commit_file_is_written_once_and_never_over_another(tmp_path: Path) -> None:
    path = _table(tmp_path)
    info = commit_info_action(1, "Append", [], 0, True, {"k": "v"})
    assert write_commit(path, 1, [info, txn_action("app", 7, 1)])
    before = Path(path, "_delta_log", f"{1:020d}.json").read_text()
    assert not write_commit(path, 1, [commit_info_action(2, "Append", [], 0, True, {})])
    assert Path(path, "_delta_log", f"{1:020d}.json").read_text() == before
    assert not [f for f in os.listdir(Path(path, "_delta_log")) if f.endswith(".tmp")]
    table = DeltaTable(path)
    assert table.version() == 1 and table.transaction_version("app") == 7
    assert table.history(1)[0]["k"] == "v"
    assert table.history(1)[0]["engineInfo"] == ENGINE_INFO


def test_adds_and_removes_round_trip_through_delta_rs(tmp_path: Path) -> None:
    """An add of a file whose directory holds an escaped partition value, then its remove
    by the path the log gave it: delta-rs lists, reads and drops it as its own."""
    path = str(tmp_path / "t")
    schema = pa.schema([("a", pa.int64()), ("p", pa.string())])
    DeltaTable.create(path, schema, partition_by=["p"])
    relative = "d/p=x%20y%25/part-0.parquet"  # the value "x y%", escaped as a directory
    os.makedirs(os.path.dirname(os.path.join(path, relative)))
    pq.write_table(pa.table({"a": pa.array([5], pa.int64())}), os.path.join(path, relative))
    size = os.path.getsize(os.path.join(path, relative))
    stats = json.dumps({"numRecords": 1, "minValues": {"a": 5}, "maxValues": {"a": 5}})
    added = add_action(relative, size, {"p": "x y%"}, 1, stats)
    assert unquote(added["add"]["path"]) == relative
    assert write_commit(path, 1, [commit_info_action(1, "Append", ["p"], 0, True, {}), added])
    table = DeltaTable(path)
    assert table.to_pyarrow_table().to_pylist() == [{"a": 5, "p": "x y%"}]
    listed = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert [a["path"] for a in listed] == [added["add"]["path"]]
    gone = LogFile(listed[0]["path"], {"p": "x y%"}, size)
    info = commit_info_action(2, "Overwrite", ["p"], 1, False, {})
    assert write_commit(path, 2, [info, remove_action(gone, 2)])
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0
    assert DeltaTable(path, version=1).to_pyarrow_table().num_rows == 1


@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["add", "remove", "txn"]),
            st.dictionaries(st.text(), st.one_of(st.integers(), st.text(), st.booleans())),
            min_size=1,
            max_size=1,
        )
    )
)
def test_commit_text_parses_back_to_the_same_actions(actions: list[dict[str, object]]) -> None:
    parsed = CommitFile.parse(3, commit_text(actions))
    assert list(parsed.actions) == actions


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1))
def test_a_log_path_decodes_to_the_files_name(name: str) -> None:
    assert unquote(log_path(f"d/p={name}/f.parquet")) == f"d/p={name}/f.parquet"


@pytest.mark.parametrize(
    ("root", "writer", "features", "configuration", "schema", "removes", "refused"),
    [
        ("/t", 2, None, {}, "{}", True, None),
        ("/t", 1, [], {}, "{}", False, None),
        ("s3://b/t", 2, None, {}, "{}", False, "not a local table"),
        ("/t", 4, None, {}, "{}", False, "writer version 4"),
        ("/t", 7, ["appendOnly"], {}, "{}", False, "writer version 7"),
        ("/t", 2, None, {}, '{"delta.invariants": "x > 0"}', False, "invariants"),
        ("/t", 2, None, {"delta.appendOnly": "true"}, "{}", True, "delta.appendOnly"),
        ("/t", 2, None, {"delta.appendOnly": "true"}, "{}", False, None),
    ],
)
def test_writable_names_what_stops_the_log_writer(
    root: str,
    writer: int,
    features: list[str] | None,
    configuration: dict[str, str],
    schema: str,
    removes: bool,
    refused: str | None,
) -> None:
    reason = writable(root, writer, features, configuration, schema, removes)
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason
