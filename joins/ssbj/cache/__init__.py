"""SSBJ hot-cache algorithms: the cache inequality, the R-cycle state machine, the cost model.

Plain, deterministic Python with no Spark import, so they can be unit- and property-tested
on their own (seeds/ssbj_semi_stream_balanced_join.txt).
"""

from __future__ import annotations
