"""The SSBJ benchmarks' pure pieces: shape parsing and the equal-service-rate state ratio."""

from __future__ import annotations

import pytest

from benchmarks.ssbj_bench import mesh_stage, state_at_equal_rate
from benchmarks.ssbj_scale import Shape


def _result(ssbj: tuple[float, float], mesh: dict[str, tuple[float, float]]) -> dict:
    result: dict = {"modes": ["ssbj", *mesh]}
    result["ssbj"] = {"rate": ssbj[0], "state_mean": ssbj[1]}
    for name, (rate, state) in mesh.items():
        result[name] = {"rate": rate, "state_mean": state}
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
    assert state_at_equal_rate(result) == (2.0, "at M (MESHJOIN already as fast)")


def test_mesh_stage_names() -> None:
    assert mesh_stage(1) == "meshjoin"
    assert mesh_stage(4.0) == "meshjoin_x4"
    assert mesh_stage(1.5) == "meshjoin_x1.5"


def test_shape_parse() -> None:
    shape = Shape.parse("10:partsupp:20000:1.5:8")
    assert shape == Shape(10.0, "partsupp", 20_000, 1.5, 8)
    assert shape.label == "SF10 partsupp, w=20,000, z=1.5, k=8"
    with pytest.raises(ValueError, match="SCALE:MASTER:BATCH:Z:K"):
        Shape.parse("10:partsupp:20000")
    with pytest.raises(ValueError, match="master must be one of"):
        Shape.parse("10:lineitem:20000:1:8")
