"""``DataFile.may_hold_since``: a file is skipped only when its log proves it holds nothing
at or after the probe, whichever side of the comparison is naive or aware."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from warehouse.delta.api import DataFile

UTC = dt.UTC
moments = st.datetimes(
    min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1)
)  # naive, read as UTC


def data_file(partition: object = None, bounds: tuple[object, object] | None = None) -> DataFile:
    return DataFile(
        path="f.parquet",
        size_bytes=1,
        num_records=1,
        partition_values={} if partition is None else {"at": partition},
        bounds={} if bounds is None else {"at": bounds},
    )


@given(value=moments, probe=moments, aware_value=st.booleans(), aware_probe=st.booleans())
def test_a_partition_value_decides_exactly(
    value: dt.datetime, probe: dt.datetime, aware_value: bool, aware_probe: bool
) -> None:
    stored = value.replace(tzinfo=UTC) if aware_value else value
    asked = probe.replace(tzinfo=UTC) if aware_probe else probe.replace(tzinfo=None)
    # A naive probe is local time; the machine's sessions run in UTC, so the expectation
    # is computed the same way the method reads it.
    asked_utc = asked.astimezone(UTC)
    assert data_file(partition=stored).may_hold_since("at", asked) == (
        value.replace(tzinfo=UTC) >= asked_utc
    )


@given(low=moments, high=moments, probe=moments, aware_bounds=st.booleans())
def test_bounds_skip_a_file_only_when_all_of_it_is_older(
    low: dt.datetime, high: dt.datetime, probe: dt.datetime, aware_bounds: bool
) -> None:
    low, high = min(low, high), max(low, high)
    if aware_bounds:
        low, high = low.replace(tzinfo=UTC), high.replace(tzinfo=UTC)
    asked = probe.replace(tzinfo=UTC)
    kept = data_file(bounds=(low, high)).may_hold_since("at", asked)
    assert kept == (high.replace(tzinfo=UTC) >= asked)


def test_whatever_the_log_cannot_prove_is_kept() -> None:
    probe = dt.datetime(2024, 1, 1, tzinfo=UTC)
    assert data_file().may_hold_since("at", probe)  # no statistics
    assert data_file(partition="2023-01-01 00:00:00").may_hold_since("at", probe)  # a string
    assert data_file(bounds=("a", "b")).may_hold_since("at", probe)  # other types
    assert not data_file(partition=dt.datetime(2023, 1, 1)).may_hold_since("at", probe)
