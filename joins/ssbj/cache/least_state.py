"""The least state any SSBJ can hold at a given stream rate, and MESHJOIN's at the same rate.

H_S holds the stream tuples of the last chunks: k chunks of w tuples over an R-cycle in the
paper, k - 1 after a step's expiry (where the pipeline counts the state, Eq. 1 in
``pipeline.ssbj.commit``). Call that number of tuples N. A join value j with stream
probability p_j is expected in n_j = N·p_j of them. Processed in the disk phase it holds
n_j·v_S bytes of H_S; processed in the cache it holds its m_j master rows, m_j·v_R bytes of
H_R (the two sides of Theorem 2, the cache inequality). Theorem 1 (minimal memory): placing
every value where it takes less memory minimises the total, so with Eq. 1's disk buffer of
b master rows,

    S_SSBJ* = b·v_R + sum_j min(m_j·v_R, n_j·v_S)

is the least state of any SSBJ that admits w tuples a step, whatever its cache holds.
MESHJOIN keeps every tuple in H_S:

    S_MESH = b·v_R + N·v_S.

Why this bounds the state ratio at equal service rate: a step of either operator reads,
joins and writes its w new tuples and one master partition, so when both steps cost the
same for the same w (measured so: ``benchmarks.ssbj_bench --experiment memory``), equal
service rates mean equal w, and MESHJOIN / SSBJ state at equal rate is at most
S_MESH / S_SSBJ*. A larger ratio needs a higher rate (larger n_j: more values pass the
inequality), not a better cache.

Invariants (property-tested): S_SSBJ* <= S_MESH; S_SSBJ* <= the state of any split of the
values between the two phases; the values it caches are exactly those where Theorem 2
holds strictly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from joins.ssbj.cache.inequality import TupleSizes


@dataclass(frozen=True)
class StateBound:
    """Expected state at one rate: the least any SSBJ holds, and MESHJOIN's."""

    ssbj_bytes: float  # S_SSBJ*
    meshjoin_bytes: float  # S_MESH
    cached_values: int  # values Theorem 1 places in the cache
    cache_share: float  # their share of the stream: what such a cache answers

    @property
    def ratio(self) -> float:
        """S_MESH / S_SSBJ*: the most MESHJOIN / SSBJ state can be at equal rate."""
        return self.meshjoin_bytes / self.ssbj_bytes if self.ssbj_bytes else float("inf")


def least_state(
    probabilities: Sequence[float],
    master_rows: Sequence[int],
    held_tuples: float,
    disk_buffer_rows: float,
    sizes: TupleSizes,
) -> StateBound:
    """The bound for values with stream ``probabilities`` (summing to at most 1; the rest of
    the stream meets no value listed and waits in H_S) and ``master_rows`` each, when
    MESHJOIN's H_S holds N = ``held_tuples`` tuples."""
    if len(probabilities) != len(master_rows):
        raise ValueError(
            f"one master row count per value expected: {len(probabilities)} probabilities, "
            f"{len(master_rows)} row counts"
        )
    if held_tuples < 0 or disk_buffer_rows < 0:
        raise ValueError(
            f"held tuples and disk buffer rows must be >= 0, got {held_tuples} "
            f"and {disk_buffer_rows}"
        )
    v_s, v_r = sizes.stream_bytes, sizes.master_bytes
    buffer = disk_buffer_rows * v_r
    held = 0.0
    cached = 0
    cached_share = 0.0
    for p, m in zip(probabilities, master_rows, strict=True):
        in_cache, in_disk = m * v_r, held_tuples * p * v_s
        if in_cache < in_disk:
            held += in_cache
            cached += 1
            cached_share += p
        else:
            held += in_disk
    # The stream's share that meets no listed value waits in H_S in either operator.
    unlisted = max(0.0, 1.0 - sum(probabilities)) * held_tuples * v_s
    return StateBound(
        ssbj_bytes=buffer + held + unlisted,
        meshjoin_bytes=buffer + held_tuples * v_s,
        cached_values=cached,
        cache_share=cached_share,
    )
