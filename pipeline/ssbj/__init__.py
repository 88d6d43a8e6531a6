"""The stateful SSBJ / MESHJOIN stage of an equi stage in ``ssbj``, ``meshjoin`` (or
``auto``, when it picks SSBJ) mode: the operator of ``joins.ssbj`` with its state kept
between steps, exactly once.

Read it downward:

- :mod:`pipeline.ssbj.driver`: the stage driver (the ``StageDriver`` protocol: step,
  drain, backfill, the audit's view of pending tuples);
- :mod:`pipeline.ssbj.stage`: the operator's steps, one Algorithm 1 iteration each;
- :mod:`pipeline.ssbj.planning`: the state a step starts from, its R-cycle position and
  its plan, saved before anything is written;
- :mod:`pipeline.ssbj.step_pass`: the step's pass over its data and its commits (at most two), with
  :mod:`pipeline.ssbj.placement` (where it runs: the driver, a collect, Spark tasks, and
  what it reads there), :mod:`pipeline.ssbj.scan_copy` (the
  master's copy for the cyclic scan) and :mod:`pipeline.ssbj.hot_keys` (key routing and
  the key sketch between steps);
- :mod:`pipeline.ssbj.commit`: the commits of the pass's result (from the driver or from
  Spark), the controller state after the step and the version pins;
- :mod:`pipeline.ssbj.state` (the controller state, typed), :mod:`pipeline.ssbj.report`
  (a step's report and metrics) and :mod:`pipeline.ssbj.wiring` (the stage's config,
  tables and services).
"""

from __future__ import annotations
