"""The SSBJ benchmarks' pure pieces: shape parsing and the equal-service-rate state ratio."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.ssbj_bench import (
    memory_config,
    mesh_stage,
    meshjoin_cost_line,
    render_memory,
    state_at_equal_rate,
    state_at_equal_rate_fitted,
)
from benchmarks.ssbj_scale import Shape
from joins.ssbj.cache.rcycle import CycleState
from pipeline.config import parse_config


def _result(ssbj: tuple[float, float], mesh: dict[str, tuple[float, float]]) -> dict:
    multiples = {"meshjoin": 1.0, "meshjoin_x2": 2.0, "meshjoin_x4": 4.0}
    result: dict = {"modes": ["ssbj", *mesh], "multiples": multiples}
    result["ssbj"] = {"rate": ssbj[0], "state_mean": ssbj[1], "tuples_per_step": 1}
    for name, (rate, state) in mesh.items():
        result[name] = {"rate": rate, "state_mean": state, "tuples_per_step": 1 if rate else 0}
    return result


def test_state_at_equal_rate_interpolates_between_bracketing_budgets() -> None:
    # MESHJOIN at M: rate 100, state 10; at 2M: rate 300, state 20. SSBJ: rate 200, state 4.
    result = _result((200, 4), {"meshjoin": (100, 10), "meshjoin_x2": (300, 20)})
    ratio, how = state_at_equal_rate(result)
    assert how == "interpolated"
    assert ratio == pytest.approx(15 / 4)


def test_state_at_equal_rate_says_when_no_budget_reaches_ssbj() -> None:
    result = _result((500, 4), {"meshjoin": (100, 10), "meshjoin_x2": (300, 20)})
    ratio, how = state_at_equal_rate(result)
    assert ratio is None
    assert how.startswith("> 5.00x")


def test_state_at_equal_rate_when_meshjoin_is_already_as_fast() -> None:
    result = _result((50, 5), {"meshjoin": (100, 10)})
    assert state_at_equal_rate(result) == (2.0, "at 1 x M (MESHJOIN already as fast)")


def test_state_at_equal_rate_goes_up_the_multiples_and_skips_runs_without_input() -> None:
    # 4M ran dry (no input measured); 2M is slower than M (noise): the bracket is M..?
    # Going up the multiples, M (100) is under 150, 2M (90) too, so none reaches it.
    result = _result(
        (150, 5), {"meshjoin": (100, 10), "meshjoin_x2": (90, 20), "meshjoin_x4": (0, 40)}
    )
    ratio, how = state_at_equal_rate(result)
    assert ratio is None
    assert how.startswith("> 4.00x")
    # With 4M measured and fast enough, the bracket is 2M..4M (not M..4M by rate order).
    result = _result(
        (150, 5), {"meshjoin": (100, 10), "meshjoin_x2": (90, 20), "meshjoin_x4": (190, 40)}
    )
    ratio, how = state_at_equal_rate(result)
    assert how == "interpolated"
    assert ratio == pytest.approx((20 + 20 * (150 - 90) / (190 - 90)) / 5)


def test_mesh_stage_names_are_identifiers_the_config_takes(tmp_path: Path) -> None:
    assert mesh_stage(1) == "meshjoin"
    assert mesh_stage(4.0) == "meshjoin_x4"
    assert mesh_stage(1.5) == "meshjoin_x1p5"
    with pytest.raises(ValueError, match="> 0"):
        mesh_stage(0)
    config, multiples = memory_config(tmp_path, "customer", 4, 1_000_000, (1.5, 2))
    assert multiples == {"ssbj": 1.0, "meshjoin": 1.0, "meshjoin_x1p5": 1.5, "meshjoin_x2": 2.0}
    parsed = parse_config(config)
    budgets = {s.name: s.operator.memory_bytes for s in parsed.stages}
    assert budgets == {
        "ssbj": 1_000_000,
        "meshjoin": 1_000_000,
        "meshjoin_x1p5": 1_500_000,
        "meshjoin_x2": 2_000_000,
    }


def test_shape_parse() -> None:
    shape = Shape.parse("10:partsupp:20000:1.5:8")
    assert shape == Shape(10.0, "partsupp", 20_000, 1.5, 8)
    assert shape.label == "SF10 partsupp, w=20,000, z=1.5, k=8"
    with pytest.raises(ValueError, match="SCALE:MASTER:BATCH:Z:K"):
        Shape.parse("10:partsupp:20000")
    with pytest.raises(ValueError, match="master must be one of"):
        Shape.parse("10:lineitem:20000:1:8")


def test_the_memory_table_gives_each_modes_step_time_by_cycle_state() -> None:
    # SSBJ's steps cost differently by R-cycle state; MESHJOIN measured no switching step.
    mode = {
        "rate": 1000.0,
        "tuples_per_step": 100.0,
        "seconds": 0.05,
        "state_mean": 5.0,
        "state_max": 6.0,
        "cache_share": 0.5,
        "bytes_read": 1e6,
        "bytes_read_max": 2e6,
    }
    ssbj = mode | {
        "by_state": {
            CycleState.PHASE_OUT: 0.04,
            CycleState.INCREMENTING: 0.06,
            CycleState.SWITCHING: 0.05,
        }
    }
    mesh = mode | {"by_state": {CycleState.INCREMENTING: 0.03, CycleState.PHASE_OUT: 0.02}}
    result = _result((1000, 5), {"meshjoin": (500, 10)})
    result |= {"master": "customer", "z": 1.0, "share": 0.5, "budget": 10.0, "k": 10}
    result |= {"ssbj": ssbj, "meshjoin": mesh}
    args = argparse.Namespace(
        scale=1.0,
        mesh_multiples=[1.0],
        memory_partitions=10,
        backlog=1000,
        commit=100,
        memory_measured_cycles=3,
        memory_warmup_cycles=2,
    )
    lines = render_memory([result], args).splitlines()
    assert "| customer | 1 | 0.5 | 0.00 | ssbj | 100 | 0.050 | 0.060, 0.050, 0.040 |" in lines[4]
    assert "| meshjoin | 100 | 0.050 | 0.030, -, 0.020 |" in lines[5]


def _timed(ssbj_rate: float, points: list[tuple[float, float, float]]) -> dict:
    """A memory result whose MESHJOIN runs have (tuples per step, step s, state) each."""
    names = [f"meshjoin_x{i}" for i in range(len(points))]
    result: dict = {"modes": ["ssbj", *names], "multiples": {}}
    result["ssbj"] = {"rate": ssbj_rate, "state_mean": 10.0, "tuples_per_step": 1}
    for name, (w, seconds, state) in zip(names, points, strict=True):
        result[name] = {"tuples_per_step": w, "seconds": seconds, "state_mean": state}
    return result


def test_the_fitted_meshjoin_line_inverts_its_rate_and_knows_its_ceiling() -> None:
    # T = 0.02 + 1e-5 w (ceiling 100k/s), state = 5 + 2 w, with the middle point noisy.
    points = [(1000.0, 0.03, 2005.0), (3000.0, 0.05 + 0.001, 6005.0), (5000.0, 0.07, 10005.0)]
    line = meshjoin_cost_line(_timed(1.0, points))
    assert line is not None
    assert line.rate_ceiling == pytest.approx(1e5, rel=0.05)
    # At 50k/s the line needs w = 50k * 0.02 / (1 - 0.5) = 2000 tuples: state 4005.
    assert line.state_at(5e4) == pytest.approx(4005, rel=0.05)
    assert line.state_at(2e5) is None
    text = state_at_equal_rate_fitted(_timed(5e4, points))
    assert float(text.split("x")[0]) == pytest.approx(400.5, rel=0.05), text  # / SSBJ's 10
    assert state_at_equal_rate_fitted(_timed(2e5, points)).startswith("unbounded")
    assert meshjoin_cost_line(_timed(1.0, points[:2])) is None
