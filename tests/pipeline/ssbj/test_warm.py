"""The state a process holds for its stage's next step (``pipeline/ssbj/warm.py``): served
only for the version it was held at, while that version's commit file is the one written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from pipeline.ssbj.warm import WarmCache

ROWS = pa.table({"a": [1, 2]})


def commit(root: Path, value: int) -> None:
    write_deltalake(str(root), pa.table({"a": [value]}), mode="append")


def test_the_held_state_is_served_for_its_version_only(tmp_path: Path) -> None:
    root = tmp_path / "state"
    commit(root, 1)
    commit(root, 2)
    warm = WarmCache()
    warm.hold_state(str(root), 1, ROWS)
    assert warm.held_state(str(root), 1) is ROWS
    assert warm.held_state(str(root), 0) is None
    warm.hold_state(str(root), None, ROWS)  # a commit whose version is not known
    assert warm.held_state(str(root), 1) is None


def test_a_table_created_again_at_the_path_is_read_not_served(tmp_path: Path) -> None:
    root = tmp_path / "state"
    commit(root, 1)
    commit(root, 2)
    warm = WarmCache()
    warm.hold_state(str(root), 1, ROWS)
    shutil.rmtree(root)
    commit(root, 3)
    commit(root, 4)  # version 1 again, of another table
    assert warm.held_state(str(root), 1) is None
    assert warm.state_rows is None  # forgotten, not kept for a later look-up


def test_a_table_on_an_object_store_is_never_held() -> None:
    warm = WarmCache()
    warm.hold_state("s3://bucket/state", 3, ROWS)
    assert warm.held_state("s3://bucket/state", 3) is None
