"""Skewed keys across a join's parallel instances: which keys are hot, and where they are
joined (used by SSBJ's key buckets; nothing here is specific to SSBJ).

- :mod:`joins.skew.asketch`: ASketch, the hottest keys in front of a count-min sketch
  (``operator.key_counts: sketch``);
- :mod:`joins.skew.greedyfit`: FastJoin's GreedyFit and SAFit, which keys to move from
  the heaviest join instance to the lightest;
- :mod:`joins.skew.key_routing`: the key routing of a step (a key's bucket, moved and
  split keys) and the monitor that plans its moves with GreedyFit.

Plain Python with no Spark import.
"""

from __future__ import annotations
