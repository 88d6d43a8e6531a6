"""SSBJ and MESHJOIN, the equi-join operators (seeds/ssbj_semi_stream_balanced_join.txt).

Read from the Spark side down to the paper's Algorithm 1:

- :mod:`joins.ssbj.step`: one step as DataFrame transforms, the wide table of new tuples,
  state and master partition rows, grouped by key bucket;
- :mod:`joins.ssbj.buckets`: one key bucket as Arrow (decode, Algorithm 1, encode), with
  :mod:`joins.ssbj.roles` naming the wide table's roles and columns;
- :mod:`joins.ssbj.columnar` (Arrow joins) and :mod:`joins.ssbj.algorithm` (the reference
  model, which reads like the paper): one loop iteration of Algorithm 1 for one bucket;
- :mod:`joins.ssbj.late`: tuples that wait in the state for master rows arriving after them.

Beside them: :mod:`joins.ssbj.cache` (the cache inequality, the R-cycle, the memory intake
and the cost model, plain Python), :mod:`joins.skew` (hot keys: the key sketch, key
routing between buckets and GreedyFit), :mod:`joins.ssbj.mesh_partitions` (the cyclic
scan's partitions), :mod:`joins.ssbj.spark_hash` (Spark's key hash in the driver) and
:mod:`joins.ssbj.choice` (``mode: auto``: SSBJ or the plain join).

The package imports nothing itself, so its plain-Python modules load without Spark.
"""

from __future__ import annotations
