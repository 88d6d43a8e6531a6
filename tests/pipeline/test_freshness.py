"""The freshness contract: bounds, the steps that keep them, and the configs refused."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import ConfigError
from pipeline.config import parse_config
from pipeline.freshness import (
    Freshness,
    FreshnessBound,
    check_steps,
    due_before,
    steps_for_bound,
)

HOUR = timedelta(hours=1)


def _config(stage: dict[str, Any], interval: str = "1h") -> dict[str, Any]:
    return {
        "name": "f",
        "schedule": {"interval": interval},
        "streams": {
            "s": {
                "landing": "/tmp/l",
                "format": "json",
                "event_time": "t",
                "id_column": "id",
                "columns": [
                    {"name": "id", "type": "bigint"},
                    {"name": "k", "type": "bigint"},
                    {"name": "t", "type": "timestamp"},
                ],
            }
        },
        "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "v"]}},
        "stages": [
            {
                "name": "e",
                "kind": "equi",
                "input": "s",
                "master": "m",
                "join_on": {"k": "mk"},
                "output": "o",
            }
            | stage
        ],
    }


def test_the_default_bound_is_one_interval_and_derives_k_steps_a_run() -> None:
    config = parse_config(_config({"operator": {"mode": "ssbj", "partitions": 8}}))
    stage = config.stages[0]
    assert stage.freshness.bound(HOUR) == FreshnessBound(1, HOUR)
    assert stage.scheduled_steps(HOUR) == 8  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("within", "intervals", "steps"),
    [
        ("1 interval", 1, 8),
        ("2 intervals", 2, 4),
        ("3 intervals", 3, 3),
        ("8h", 8, 1),
        ("90m", 1, 8),
    ],
)
def test_a_longer_bound_spreads_the_cycle_over_runs(
    within: str, intervals: int, steps: int
) -> None:
    config = parse_config(
        _config({"operator": {"partitions": 8}, "freshness": {"complete_within": within}})
    )
    stage = config.stages[0]
    assert stage.freshness.bound(HOUR).intervals == intervals
    assert stage.scheduled_steps(HOUR) == steps  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("stage", "interval", "key", "numbers"),
    [
        (
            {"operator": {"mode": "ssbj", "partitions": 8, "steps_per_run": 1}},
            "1h",
            "stages.0.operator.steps_per_run",
            ["1 step(s) a run", "k = 8", "at least 8", "at least 8 intervals"],
        ),
        (
            {
                "operator": {"partitions": 8, "steps_per_run": 3},
                "freshness": {"complete_within": "2 intervals"},
            },
            "1h",
            "stages.0.operator.steps_per_run",
            ["give a tuple 6 step(s)", "at least 4", "at least 3 intervals"],
        ),
        (
            {"operator": {"mode": "baseline", "late_master": {"wait": "3h"}}},
            "1h",
            "stages.0.operator.late_master.wait",
            ["3h", "1 interval (1h)", "at least 3 intervals"],
        ),
        (
            {"freshness": {"complete_within": "10m"}},
            "1h",
            "stages.0.freshness.complete_within",
            ["10m is shorter than the schedule's interval (1h)"],
        ),
        (
            {"freshness": {"complete_within": "0 intervals"}},
            "1h",
            "stages.0.equi.freshness.complete_within",
            ["at least 1 interval"],
        ),
        (
            {"freshness": {"complete_within": "soon"}},
            "1h",
            "stages.0.equi.freshness.complete_within",
            ["`N interval(s)` or a duration"],
        ),
    ],
)
def test_a_config_that_cannot_keep_its_bound_is_refused_naming_the_numbers(
    stage: dict[str, Any], interval: str, key: str, numbers: list[str]
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(_config(stage, interval))
    message = str(raised.value)
    assert key in message
    for number in numbers:
        assert number in message


def test_a_baseline_stage_keeps_any_bound_whatever_its_steps() -> None:
    config = parse_config(
        _config({"operator": {"mode": "baseline", "partitions": 8, "steps_per_run": 1}})
    )
    assert config.stages[0].freshness.complete_within == "1 interval"


@given(st.integers(1, 64), st.integers(1, 16))
def test_derived_steps_are_the_fewest_that_answer_a_tuple_within_the_bound(k: int, b: int) -> None:
    bound = FreshnessBound(b, HOUR)
    steps = steps_for_bound(k, bound)
    check_steps(k, steps, bound)  # keeps it
    assert steps * b >= k
    if steps > 1:
        with pytest.raises(ValueError, match="R-cycle needs"):
            check_steps(k, steps - 1, bound)
    assert steps == math.ceil(k / b)


@given(
    st.lists(st.integers(0, 1000), min_size=0, max_size=6, unique=True).map(sorted),
    st.integers(1, 6),
)
def test_due_tuples_are_those_that_entered_b_runs_back_or_earlier(
    starts: list[int], b: int
) -> None:
    next_step = (starts[-1] + 1) if starts else 0
    threshold = due_before(starts, next_step, FreshnessBound(b, HOUR))
    if b == 1:
        assert threshold == next_step  # everything pending is due
    elif len(starts) < b - 1:
        assert threshold == 0  # too few runs known: nothing is due
    else:
        # A tuple of run starts[-(b - 1)] (b - 1 runs including this one) is not due; one
        # from the run before it is.
        assert threshold == starts[-(b - 1)]
        assert all(s < threshold for s in starts[: -(b - 1)])


def test_freshness_model_keeps_the_text_as_written() -> None:
    assert Freshness(complete_within=" 2 intervals ").complete_within == "2 intervals"
    assert Freshness().bound(timedelta(minutes=15)).describe() == "1 interval (15m)"
