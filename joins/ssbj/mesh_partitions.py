"""MESHJOIN master partitioning: split a snapshot's files into k parts of near-equal bytes.

Longest-processing-time greedy: files by descending size (path breaks ties) go to the
currently lightest part (lowest index breaks ties). Deterministic for a given file list, so
every step that reads "partition p of version V" reads the same files, and the k partitions
of one version are disjoint and cover all its files: each pending tuple pinned to V meets
every master row of V exactly once over k consecutive steps.

Bound: the heaviest part exceeds the mean by at most the largest file (LPT's 4/3 bound
holds for the makespan); with fewer files than k some parts are empty.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def partition_by_bytes(files: Sequence[tuple[str, int]], parts: int) -> list[list[str]]:
    """Assign ``(path, size)`` files to ``parts`` lists; each list is sorted by path."""
    if parts < 1:
        raise ValueError(f"need at least one partition, got {parts}")
    heap = [(0, index) for index in range(parts)]
    assigned: list[list[str]] = [[] for _ in range(parts)]
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        load, index = heapq.heappop(heap)
        assigned[index].append(path)
        heapq.heappush(heap, (load + size, index))
    return [sorted(paths) for paths in assigned]
