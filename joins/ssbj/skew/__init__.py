"""Hot keys across SSBJ's key buckets: which keys are hot, and where they are joined.

- :mod:`joins.ssbj.skew.asketch`: ASketch, the hottest keys in front of a count-min sketch
  (``operator.key_counts: sketch``);
- :mod:`joins.ssbj.skew.greedyfit`: FastJoin's GreedyFit and SAFit, which keys to move from
  the heaviest join instance to the lightest;
- :mod:`joins.ssbj.skew.key_routing`: the key routing of a step (a key's bucket, moved and
  split keys) and the monitor that plans its moves with GreedyFit.

Plain Python with no Spark import.
"""

from __future__ import annotations
