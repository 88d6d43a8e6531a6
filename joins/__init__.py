"""Join operators on Spark: baselines, SSBJ/MESHJOIN for equi-joins, A-DSP for theta joins.

Everything here is a pure transform (DataFrames in, DataFrames out); IO stays in
``warehouse`` and orchestration in ``pipeline``.
"""

from __future__ import annotations
