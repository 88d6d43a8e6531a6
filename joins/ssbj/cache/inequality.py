"""The cache inequality of SSBJ (Theorem 2) and the two decisions built on it.

Theorem 2: a join value j that matches ``m`` master rows and ``n`` stream tuples per
R-cycle uses less memory in the cache H_R than in the disk phase H_S iff

    m · v_R  <  n · v_S

where v_R and v_S are the bytes of one projected master row and one stream tuple.
Theorem 1: placing every join value on its cheaper side minimises total memory.

Algorithm 1 applies it twice, each with the hysteresis factor s_f (the paper finds s_f = 1
best, Fig. 6(a)):

- switching (line 33): move j into the cache if ``|H_S(j)| · v_S > s_f · s_count(j) · v_R``;
- eviction (line 46): drop j from the cache if ``|H_R(j)| · v_R >= s_f · f_count(j)/10 · v_S``,
  f_count having been counted over the 10 R-cycles since the last eviction pass.

A join value with no master rows (m = 0) is switched as soon as it is pending at all, and
evicted once it is no longer probed: the negative cache the paper describes.
"""

from __future__ import annotations

from dataclasses import dataclass

EVICTION_PERIOD_CYCLES = 10


@dataclass(frozen=True)
class TupleSizes:
    """Measured bytes of one stream tuple (v_S) and one projected master row (v_R)."""

    stream_bytes: float
    master_bytes: float

    def __post_init__(self) -> None:
        if self.stream_bytes <= 0 or self.master_bytes <= 0:
            raise ValueError(
                "tuple sizes must be positive, got "
                f"v_S={self.stream_bytes}, v_R={self.master_bytes}"
            )


def cache_is_cheaper(master_rows: int, stream_tuples: float, sizes: TupleSizes) -> bool:
    """Theorem 2: ``m · v_R < n · v_S``."""
    return master_rows * sizes.master_bytes < stream_tuples * sizes.stream_bytes


def should_switch_into_cache(
    pending_tuples: int, master_rows: float, sizes: TupleSizes, switch_factor: float = 1.0
) -> bool:
    """Algorithm 1, line 33: ``m_disk > s_f · m_cache`` for a value pending in H_S."""
    if pending_tuples <= 0:
        return False
    m_disk = pending_tuples * sizes.stream_bytes
    m_cache = master_rows * sizes.master_bytes
    return m_disk > switch_factor * m_cache


def estimated_master_rows(
    counted_rows: int, partitions_observed: int, partitions: int
) -> float | None:
    """s_count(j) extrapolated to all k partitions from the partitions it was counted in,
    or None while the value's master rows are unknown.

    Algorithm 1 counts a value's master rows only while the value is pending, so a value
    that became pending mid-cycle is undercounted. Scaling by k / observed removes that
    bias when some row was counted. When none was, the rows are known only if every
    partition was seen (then m = 0: the negative cache): a value with one master row, a
    foreign key's, shows no row in each partition but its own, so no row over part of the
    cycle says nothing of m. Taken as m = 0, it cached every value a tuple had waited for
    without meeting its partition: 83% of the stream's tuples on SF1 customer at z = 1,
    where Theorem 1's least state caches 79%, and a cache 35% larger than that state
    (BENCHMARKS section 3). Callers leave an unknown value where it is (H_S); while it
    stays frequent, a later switching cycle finds it counted over a whole R-cycle.
    """
    if partitions_observed <= 0:
        return None
    if counted_rows == 0 and partitions_observed < partitions:
        return None
    return counted_rows * partitions / partitions_observed


def should_evict(
    cached_rows: int,
    hits: int,
    sizes: TupleSizes,
    switch_factor: float = 1.0,
    period_cycles: int = EVICTION_PERIOD_CYCLES,
) -> bool:
    """Algorithm 1, line 46: ``m_cache >= s_f · m_disk`` with m_disk = f_count/period · v_S."""
    m_cache = cached_rows * sizes.master_bytes
    m_disk = hits / period_cycles * sizes.stream_bytes
    return m_cache >= switch_factor * m_disk
