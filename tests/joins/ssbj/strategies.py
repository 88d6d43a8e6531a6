"""Hypothesis strategies the SSBJ property tests share."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def run_parameters(partitions: int, steps: int) -> dict[str, st.SearchStrategy[Any]]:
    """A run of SSBJ steps: a seed for its data, k partitions (up to ``partitions``), the
    counters' period, the cache on or off, an inner or left join, the s_count estimator and
    up to ``steps`` steps."""
    return {
        "seed": st.integers(0, 10_000),
        "k": st.integers(1, partitions),
        "period": st.integers(1, 3),
        "use_cache": st.booleans(),
        "left": st.booleans(),
        "estimator": st.sampled_from(["paper", "extrapolated"]),
        "steps": st.integers(1, steps),
    }
