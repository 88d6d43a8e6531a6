"""A-DSP, the adaptive theta join (seeds/a-dsp_adaptive_theta_join.txt).

- :mod:`joins.theta.adsp.join`: the join on Spark, two-layer routing (Alg. 3) and sorted
  local joins per task;
- :mod:`joins.theta.adsp.plan`: histograms, candidate band, coverage areas and routing
  tables, built from :mod:`joins.theta.adsp.areas` (area dichotomy, Alg. 2) and
  :mod:`joins.theta.adsp.scheme` (the varietal matrix of one area, Alg. 1);
- :mod:`joins.theta.adsp.adapt`, :mod:`joins.theta.adsp.migration` and
  :mod:`joins.theta.adsp.migrated_rows`: scheme changes across runs (Sec. 5.5, Alg. 4 and 5)
  and their application to a kept master layout.
"""

from __future__ import annotations
