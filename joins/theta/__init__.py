"""Theta joins (band, range and inequality predicates) of a theta stage.

- :mod:`joins.theta.predicate`: the predicate as the config declares it (no Spark import);
- :mod:`joins.theta.join`: one theta join under a named scheme, ``auto`` resolved first;
- :mod:`joins.theta.choice`: the rules of ``scheme: auto`` (Spark's nested loop, range
  binning or A-DSP), from size estimates, counts and key samples;
- :mod:`joins.theta.stats` and :mod:`joins.theta.key_sample`: the counts and key samples
  drawn by Spark, and the histograms and candidate ranges derived from them;
- :mod:`joins.theta.adsp`: the A-DSP scheme (seeds/a-dsp_adaptive_theta_join.txt).

The package imports nothing itself, so the config can load the predicate without Spark.
"""

from __future__ import annotations
