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
    StreamNeed,
    check_steps,
    due_before,
    steps_for_bound,
    stream_need,
    stream_trigger,
)
from tests.helpers import equi_stage, json_stream

HOUR = timedelta(hours=1)


def _config(stage: dict[str, Any], interval: str = "1h") -> dict[str, Any]:
    return {
        "name": "f",
        "schedule": {"interval": interval},
        "streams": {
            "s": json_stream("/tmp/l", ["id bigint", "k bigint", "t timestamp"], event_time="t")
        },
        "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "v"]}},
        "stages": [equi_stage(name="e", output="o", **stage)],
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


# ---------------------------------------------------------------------- the continuous mode


def test_the_stream_bound_is_stream_within_else_the_scheduled_bound() -> None:
    assert Freshness().stream_bound(HOUR) == HOUR
    assert Freshness(complete_within="3 intervals").stream_bound(HOUR) == 3 * HOUR
    assert Freshness(complete_within="2h").stream_bound(HOUR) == 2 * HOUR
    given_bound = Freshness(complete_within="3 intervals", stream_within="10m")
    assert given_bound.stream_bound(HOUR) == timedelta(minutes=10)


@pytest.mark.parametrize("text", ["soon", "0s", "-5m", "1.5m"])
def test_a_stream_bound_that_is_no_duration_is_refused_naming_the_key(text: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config(_config({"freshness": {"stream_within": text}}))
    assert "stages.0.equi.freshness.stream_within" in str(raised.value)
    assert text in str(raised.value)


def test_the_derived_trigger_lets_an_ssbj_tuple_wait_k_plus_one_triggers() -> None:
    ssbj = stream_need("e", 9, timedelta(minutes=10))
    assert ssbj.triggers == 10
    assert stream_trigger([ssbj]) == timedelta(minutes=1)
    plain = stream_need("p", None, timedelta(minutes=2))
    assert plain.triggers == 2
    # The tightest stage decides.
    assert stream_trigger([ssbj, plain]) == timedelta(minutes=1)
    assert stream_trigger([ssbj, stream_need("q", None, timedelta(seconds=60))]) == timedelta(
        seconds=30
    )


def test_a_given_trigger_that_cannot_keep_a_bound_is_refused_naming_the_numbers() -> None:
    needs = [stream_need("fast", 9, timedelta(minutes=10))]
    assert stream_trigger(needs, timedelta(seconds=45)) == timedelta(seconds=45)
    with pytest.raises(ValueError) as raised:
        stream_trigger(needs, timedelta(minutes=2))
    message = str(raised.value)
    for part in ("fast", "2m", "10 triggers", "20m", "10m", "at most 1m"):
        assert part in message
    with pytest.raises(ValueError, match="no stage"):
        stream_trigger([])


@given(
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(1, 64)), st.integers(1, 100_000)),
        min_size=1,
        max_size=5,
    )
)
def test_the_derived_trigger_keeps_every_bound_and_is_the_longest_that_does(
    stages: list[tuple[int | None, int]],
) -> None:
    needs = [
        stream_need(f"s{i}", k, timedelta(seconds=seconds)) for i, (k, seconds) in enumerate(stages)
    ]
    trigger = stream_trigger(needs)
    assert all(trigger * n.triggers <= n.bound + timedelta(microseconds=n.triggers) for n in needs)
    tightest = min(needs, key=lambda n: n.bound / n.triggers)
    longer = trigger + timedelta(milliseconds=1)
    assert longer * tightest.triggers > tightest.bound
    assert isinstance(tightest, StreamNeed)
