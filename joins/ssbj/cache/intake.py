"""How many new stream tuples one SSBJ step admits under the memory budget M (Eq. 1).

Eq. 1 of the SSBJ paper (Section 3.2.1) splits the operator's memory into the disk buffer,
the cache H_R and the disk-phase hash table H_S:

    M = (b + h_R)·v_R + w_S·(R_t/b)·v_S

where b is the rows of one master partition, h_R the cached master rows, and H_S holds
R_t/b = k chunks of w_S tuples each (the queue pointers of the paper are folded into v_S
here; the pending tuple's bookkeeping columns travel with it). Solved for the chunk:

    w_S = (M - (b + h_R)·v_R) / (k·v_S)

Algorithm 1 line 10 adapts w from M; like the paper's own MESHJOIN variant (Section 3.1) we
size each chunk "at the moment it is created", from the H_R in force at that step, and
never beyond the memory actually free after this step's oldest chunk expires (a cache that
grew since the older chunks entered leaves less room).

Beyond the paper, the switching buffer's rows are counted with H_R's: M = (b + h_R +
|s_B|)·v_R + ... . Eq. 1 leaves s_B out, but its rows are held through the switching cycle
(line 34) and become H_R at the next phase-out (line 10), so a budget that leaves them out
is exceeded through that cycle and at the move by up to |s_B|·v_R: 16% of M on SF1
customer at z = 1 and M = 0.5 x |R|·v_R (BENCHMARKS section 3). Counted, the chunks of the
switching cycle make room for them as they are collected.

The stream is admitted in whole input versions (a version is one commit of the input
table; partial versions would need a row order the input does not have). Only the misses
of the cache phase enter H_S, so a version of n tuples is expected to take
``n · miss_rate`` slots, with the miss rate the operator measured on its last step (1 for
MESHJOIN, and before SSBJ's cache has filled).

Invariant of :func:`admit`: the admitted versions are a prefix of the candidates in version
order whose expected H_S rows fit the free capacity, extended by exactly one version only
when nothing would otherwise be pending at all (so a version larger than M cannot stall
the stage forever: it runs alone, and the overshoot is reported).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from joins.ssbj.cache.inequality import TupleSizes


@dataclass(frozen=True)
class OperatorMemory:
    """The rows the operator holds during one step, beside the new chunk."""

    disk_buffer_rows: float  # b: master rows of one partition
    cache_rows: int  # h_R: H_R rows, empty markers included
    pending_rows: int  # H_S rows that stay after this step's expiry
    switch_rows: int = 0  # |s_B|: master rows the switching buffer holds

    @property
    def master_rows(self) -> float:
        """The master rows held: the disk buffer, H_R and s_B."""
        return self.disk_buffer_rows + self.cache_rows + self.switch_rows

    def bytes(self, sizes: TupleSizes, new_pending: int = 0) -> float:
        """Eq. 1 with s_B: (b + h_R + |s_B|)·v_R + (H_S + new chunk)·v_S."""
        return self.master_rows * sizes.master_bytes + (self.pending_rows + new_pending) * (
            sizes.stream_bytes
        )


@dataclass(frozen=True)
class Admission:
    """The outcome for one step: the last input version admitted and why."""

    to_version: int  # the step consumes input versions (offset, to_version]
    admitted_rows: int
    capacity_rows: int  # w_S the free memory allows
    backlog_rows: int  # candidate rows left waiting in the input table
    forced: bool = False  # one version admitted beyond the capacity, to make progress


def chunk_capacity(
    budget_bytes: int, memory: OperatorMemory, sizes: TupleSizes, partitions: int
) -> int:
    """w_S of Eq. 1 for this step, capped by the H_S room still free (never negative)."""
    if partitions < 1:
        raise ValueError(f"need k >= 1 partitions, got {partitions}")
    master_bytes = memory.master_rows * sizes.master_bytes
    queue_rows = (budget_bytes - master_bytes) / sizes.stream_bytes  # k·w_S
    free_rows = queue_rows - memory.pending_rows
    return max(0, math.floor(min(queue_rows / partitions, free_rows)))


def admit(
    offset: int,
    candidates: Sequence[tuple[int, int]],
    capacity_rows: int,
    miss_rate: float,
    nothing_pending: bool,
) -> Admission:
    """Choose the input versions a step takes.

    ``candidates`` are ``(version, rows)`` of the input versions after ``offset``, in any
    order; ``miss_rate`` is the share of admitted tuples expected to enter H_S (0 to 1).
    """
    if not 0.0 <= miss_rate <= 1.0:
        raise ValueError(f"miss rate must be within [0, 1], got {miss_rate}")
    ordered = sorted(candidates)
    if any(version <= offset for version, _ in ordered):
        raise ValueError(f"candidate versions must be after the offset {offset}: {ordered}")
    total = sum(rows for _, rows in ordered)
    to_version, admitted = offset, 0
    for version, rows in ordered:
        if (admitted + rows) * miss_rate > capacity_rows:
            break
        to_version, admitted = version, admitted + rows
    forced = False
    if to_version == offset and ordered and nothing_pending:
        to_version, admitted = ordered[0][0], ordered[0][1]
        forced = admitted * miss_rate > capacity_rows
    return Admission(to_version, admitted, capacity_rows, total - admitted, forced)
