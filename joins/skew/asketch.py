"""ASketch: a small filter of the hottest keys in front of a count-min sketch.

STA (seeds/sta_stream_aware_inequality_join.txt), Section 3.2 and Algorithm 1, after Roy
et al.'s augmented sketch. Two layers:

- ``L1``, the filter: at most ``phi`` keys, each with a new count ``N_c`` and an old count
  ``O_c``. ``N_c`` is the key's estimated total; ``N_c - O_c`` is what it gathered while in
  the filter (exactly, since a key in the filter is counted there and nowhere else).
- ``L2``, a count-min sketch of ``depth`` rows of ``width`` counters (Cormode and
  Muthukrishnan): a key adds 1 to one counter per row, and its estimate is the smallest of
  its counters.

:meth:`ASketch.add` is Algorithm 1: a key in ``L1`` gets ``N_c += 1`` and is hot (lines
1-4); a new key enters ``L1`` with ``N_c = 1, O_c = 0`` while there is room (lines 5-7,
not yet hot); otherwise it goes to the sketch (line 9), and when its estimate there
exceeds the smallest ``N_c`` of ``L1`` (the top of the filter's priority queue), the two
swap (lines 10-13): the evicted key's ``N_c - O_c`` goes back into the sketch at its own
counters, and the new key enters ``L1`` with ``N_c = O_c =`` its estimate, which stays in
the sketch.

Invariants (property-tested against exact counts):

1. no key is ever underestimated: ``estimate(k) >= count(k)``;
2. conservation: for every sketch row, the row's sum plus the filter's ``N_c - O_c`` equals
   the number of keys added (a swap moves counts between the layers, never loses any);
3. the count-min bound: a key outside the filter is overestimated by at most the sum of
   the other keys that share its counter in the best row, ``<= e/width`` of the stream with
   probability ``1 - exp(-depth)`` over the hash seeds.

:meth:`ASketch.merge` combines sketches built over separate parts of a stream (one per
Spark partition) into the sketch of the whole: the sketches are added counter by counter,
each filter's ``N_c - O_c`` is put back into the sum at its key's counters, and the merged
filter keeps the ``phi`` candidates with the largest merged estimates. The invariants hold
for the merged sketch over the union of the parts.

Hashing is seeded and stable across processes (BLAKE2b of the key's type and value), so
sketches built by different executors and runs line up, and a sketch serialises to plain
JSON (:meth:`ASketch.to_dict`, non-zero counters only) for the operator state.
:class:`SketchShape` is the size a configuration asks for; sketches of one shape merge.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A key the sketch counts: what a join column holds (ints, strings, dates as ISO strings).
Key = Hashable


@dataclass(frozen=True)
class SketchShape:
    """The size of a sketch: ``phi`` filter slots over ``depth`` x ``width`` counters."""

    phi: int
    depth: int
    width: int
    seed: int = 0

    def empty(self) -> ASketch:
        return ASketch(self.phi, self.depth, self.width, self.seed)


@dataclass
class FilterEntry:
    """One key of ``L1``: its estimated total ``new`` and the part ``old`` it brought in."""

    new: int
    old: int

    @property
    def gathered(self) -> int:
        return self.new - self.old


@dataclass
class ASketch:
    """The augmented sketch; ``phi`` filter slots over ``depth`` x ``width`` counters."""

    phi: int = 32
    depth: int = 4
    width: int = 1024
    seed: int = 0
    added: int = 0
    filter: dict[Key, FilterEntry] = field(default_factory=dict)
    counters: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.phi < 1 or self.depth < 1 or self.width < 1:
            raise ValueError(
                f"ASketch: expected phi, depth and width >= 1, found phi={self.phi} "
                f"depth={self.depth} width={self.width}"
            )
        if self.seed < 0 or self.seed >= 2**128:
            raise ValueError(f"ASketch: expected a seed in [0, 2**128), found {self.seed}")
        if not self.counters:
            self.counters = [[0] * self.width for _ in range(self.depth)]
        if len(self.counters) != self.depth or any(len(r) != self.width for r in self.counters):
            raise ValueError(
                f"ASketch: expected {self.depth} rows of {self.width} counters, found "
                f"{[len(r) for r in self.counters]}"
            )

    @classmethod
    def for_error(cls, epsilon: float, delta: float, phi: int = 32, seed: int = 0) -> ASketch:
        """The sketch whose count-min layer overestimates by at most ``epsilon`` of the
        stream with probability ``1 - delta``: width ``ceil(e / epsilon)``, depth
        ``ceil(ln(1 / delta))``."""
        if not (0 < epsilon < 1 and 0 < delta < 1):
            raise ValueError(f"expected 0 < epsilon, delta < 1, found {epsilon}, {delta}")
        width = math.ceil(math.e / epsilon)
        depth = math.ceil(math.log(1 / delta))
        return cls(phi=phi, depth=depth, width=width, seed=seed)

    # ------------------------------------------------------------------ Algorithm 1

    def add(self, key: Key, count: int = 1) -> bool:
        """Count ``key`` ``count`` times; True when it is hot (in the filter) afterwards, as
        Algorithm 1 reports it (a key that just took a free slot is not hot yet)."""
        if count < 1:
            raise ValueError(f"ASketch.add: expected a count >= 1, found {count}")
        self.added += count
        entry = self.filter.get(key)
        if entry is not None:  # lines 2-4
            entry.new += count
            return True
        if len(self.filter) < self.phi:  # lines 5-7
            self.filter[key] = FilterEntry(count, 0)
            return False
        cells = self._cells(key)  # line 9
        for row, column in enumerate(cells):
            self.counters[row][column] += count
        estimate = min(self.counters[r][c] for r, c in enumerate(cells))
        coldest, top = min(self.filter.items(), key=lambda item: (item[1].new, _order(item[0])))
        if estimate <= top.new:  # line 14
            return False
        # lines 10-13: swap; the evicted key's own gathering goes back to the sketch
        del self.filter[coldest]
        if top.gathered:
            for row, column in enumerate(self._cells(coldest)):
                self.counters[row][column] += top.gathered
        self.filter[key] = FilterEntry(estimate, estimate)
        return True

    def add_all(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.add(key)

    def estimate(self, key: Key) -> int:
        """The key's estimated count: ``N_c`` in the filter, else its smallest counter."""
        entry = self.filter.get(key)
        if entry is not None:
            return entry.new
        return min(self.counters[r][c] for r, c in enumerate(self._cells(key)))

    def is_hot(self, key: Key) -> bool:
        return key in self.filter

    @property
    def shape(self) -> SketchShape:
        return SketchShape(self.phi, self.depth, self.width, self.seed)

    def hot_keys(self) -> list[tuple[Key, int]]:
        """The filter's keys with their estimates, largest first."""
        return sorted(
            ((k, e.new) for k, e in self.filter.items()),
            key=lambda item: (-item[1], _order(item[0])),
        )

    # ------------------------------------------------------------------ combining

    def merge(self, other: ASketch) -> ASketch:
        """The sketch of both parts' keys (see the module docstring)."""
        return ASketch.merge_all([self, other])

    @staticmethod
    def merge_all(parts: Sequence[ASketch]) -> ASketch:
        """The sketch of all parts' keys at once: the same as merging them pairwise, with
        the filter ranked once instead of once per pair (a step merges one part per key
        bucket)."""
        if not parts:
            raise ValueError("ASketch.merge_all: expected at least one sketch, found none")
        shape = parts[0].shape
        for part in parts[1:]:
            if part.shape != shape:
                raise ValueError(
                    "ASketch.merge: expected sketches of the same phi, depth, width and seed, "
                    f"found {shape} and {part.shape}"
                )
        merged = shape.empty()
        merged.added = sum(part.added for part in parts)
        for part in parts:
            for row in range(shape.depth):
                target, source = merged.counters[row], part.counters[row]
                for column, value in enumerate(source):
                    if value:
                        target[column] += value
            for key, entry in part.filter.items():
                if entry.gathered:
                    for row, column in enumerate(merged._cells(key)):
                        merged.counters[row][column] += entry.gathered
        candidates = {key for part in parts for key in part.filter}
        estimates = {key: merged.estimate(key) for key in candidates}
        ranked = sorted(candidates, key=lambda k: (-estimates[k], _order(k)))
        for key in ranked[: shape.phi]:
            merged.filter[key] = FilterEntry(estimates[key], estimates[key])
        return merged

    # ------------------------------------------------------------------ state

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; keys must be JSON scalars (int, float, str, bool, None).

        Counters are saved as ``[row, column, value]`` for the non-zero ones: a sketch of
        a few hundred keys (one key bucket's step) fills a few hundred of its cells."""
        return {
            "phi": self.phi,
            "depth": self.depth,
            "width": self.width,
            "seed": self.seed,
            "added": self.added,
            "filter": [[k, e.new, e.old] for k, e in self.filter.items()],
            "cells": [
                [r, c, v] for r, row in enumerate(self.counters) for c, v in enumerate(row) if v
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ASketch:
        try:
            sketch = cls(
                phi=int(data["phi"]),
                depth=int(data["depth"]),
                width=int(data["width"]),
                seed=int(data["seed"]),
                added=int(data["added"]),
            )
            for row, column, value in data["cells"]:
                if not (0 <= int(row) < sketch.depth and 0 <= int(column) < sketch.width):
                    raise ValueError(f"cell ({row}, {column}) is outside the counters")
                sketch.counters[int(row)][int(column)] = int(value)
            for key, new, old in data["filter"]:
                sketch.filter[key] = FilterEntry(int(new), int(old))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"ASketch.from_dict: not a saved sketch: {e}") from e
        return sketch

    def size_bytes(self) -> int:
        """Memory of the counters (8 bytes each) and the filter's entries (keys as 16)."""
        return 8 * self.depth * self.width + 32 * len(self.filter)

    # ------------------------------------------------------------------ hashing

    def _cells(self, key: Key) -> tuple[int, ...]:
        """The key's counter in each row: 8 bytes of a seeded BLAKE2b digest per row."""
        token, salt = _token(key), self.seed.to_bytes(16, "little")
        digest = b"".join(
            hashlib.blake2b(
                token, digest_size=64, salt=salt, person=chunk.to_bytes(16, "little")
            ).digest()
            for chunk in range(-(-self.depth // 8))
        )
        return tuple(
            int.from_bytes(digest[8 * row : 8 * row + 8], "little") % self.width
            for row in range(self.depth)
        )


def _token(key: Key) -> bytes:
    """A stable byte form of a key: its type name and value (1 and 1.0 and "1" differ)."""
    return f"{type(key).__name__}:{key!r}".encode()


def _order(key: Key) -> str:
    """A total order over keys of any type, for deterministic ties."""
    return f"{type(key).__name__}:{key!r}"
