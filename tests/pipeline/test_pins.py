"""Pins: the versions each holder keeps from vacuum, merged per normalised table path."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from pipeline.layout import WarehouseLayout
from pipeline.pins import audit_pins, input_versions, table_key, union_pins
from tests.pipeline.ssbj_harness import config_for

PATHS = st.sampled_from(["a", "./a", "b", "s3://bucket/t", "/abs/c"])
PINS = st.dictionaries(PATHS, st.lists(st.integers(0, 50), max_size=6), max_size=4)


@given(st.lists(PINS, max_size=4))
def test_union_holds_every_pinned_version_once_under_one_spelling(
    pins: list[dict[str, list[int]]],
) -> None:
    merged = union_pins(*pins)
    expected: dict[str, set[int]] = {}
    for mapping in pins:
        for path, versions in mapping.items():
            expected.setdefault(table_key(path), set()).update(versions)
    assert merged == {path: sorted(v) for path, v in expected.items() if v}
    assert all(versions == sorted(set(versions)) for versions in merged.values())


def test_relative_and_absolute_spellings_are_one_table_and_urls_stay_as_given() -> None:
    assert table_key("./a") == table_key(os.path.abspath("a"))
    assert table_key("s3://bucket/t") == "s3://bucket/t"


@given(st.integers(-1, 20), st.integers(0, 20))
def test_input_versions_are_those_rows_added_reads(after: int, to: int) -> None:
    versions = list(input_versions(after, to))
    assert versions == [v for v in range(0, 21) if after < v <= to]


def test_audit_pins_cover_the_audited_batch_the_pending_table_and_an_open_intent(
    tmp_path: Path,
) -> None:
    layout = WarehouseLayout.of(config_for(tmp_path, "ssbj", 2, 1, "left"))
    silver = table_key(layout.staged("out"))
    state = {
        "output_version": 4,
        "pending_version": 7,
        "pending_table": str(tmp_path / "hs"),
        "intent": {"batch": [4, 6], "record": {"pending_version": 9, "pending_table": "x"}},
    }
    assert audit_pins(layout, "out", state) == {
        silver: [4, 6],
        table_key(str(tmp_path / "hs")): [7],
        table_key("x"): [9],
    }
    # A fresh audit state pins nothing.
    assert audit_pins(layout, "out", {}) == {}
