"""Key routing of the SSBJ operator: which key bucket, and so which Spark task, a join value
is processed in, and how GreedyFit moves hot keys between buckets.

A join value with Spark's ``xxhash64`` ``h`` lives in bucket ``pmod(h, B)`` (its *home*)
unless the routing table moves it: :attr:`KeyRouting.moved` maps key hashes to other
buckets. Keys are named by their 64-bit hash, not their value, so the table is a few
integers whatever the join columns' types; two values that share a hash move together,
which costs balance, never correctness.

Invariant (what keeps the join exact while keys move, FastJoin's Algorithm 2 in the step
model): every row of a join value in one step - new and pending stream tuples, cache rows,
counters, master partition rows, master changes - is placed by the *same* routing, the one
recorded in the controller state when the step was planned. The operator's state is at
rest in its state table between steps and re-bucketed by every step, so a migration is
one atomic switch of routing between two steps: no tuple is in flight in a bucket that
loses its key, none can meet its matches in two buckets. A rerun of an interrupted step
reads the routing it was planned with, because a new routing is only saved with the
completed step.

Buckets are Spark tasks one to one. ``groupBy(bucket)`` sends a group to shuffle partition
``pmod(murmur3(label), B)`` (Spark's ``HashPartitioning``, seed 42); labelling bucket ``b``
with the smallest non-negative int whose Murmur3 hash is ``b`` mod ``B``
(:func:`task_labels`) puts bucket ``b`` in task ``b``. Labelling with ``b`` itself, as the
operator did before, places the buckets like balls in bins: with B = 2 both buckets land
in one task (the other idles), with B = 8 three tasks idle, with B = 64 27 tasks idle and
one holds four buckets, before any key skew.

Load and migration (:func:`rebalance`): each step's buckets report their totals and their
heaviest keys (:class:`BucketLoad`); FastJoin's Eq. 1-2 give the loads and the imbalance,
and while ``LI > theta`` GreedyFit (Algorithm 1) or SAFit (Algorithm 3) picks keys to move
from the heaviest bucket to the lightest (``joins.skew.greedyfit.plan_rebalance``).

Splitting (:func:`plan_splits`, beyond FastJoin, whose migration moves whole keys): a key
with more tuples than a bucket should hold cannot be balanced by moving it. Its tuples are
spread over several buckets instead, each with a copy of the rows they need
(:class:`KeyRouting`), the way STA's two-choice routing spreads a hot key.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from joins.skew.greedyfit import InstanceLoad, KeyLoad, Migration, imbalance, plan_rebalance

Method = Literal["greedyfit", "safit"]
METHODS: tuple[Method, ...] = ("greedyfit", "safit")

_MASK = 0xFFFFFFFF


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``Murmur3_x86_32.hashInt`` (what ``hash(int)`` and ``HashPartitioning``
    compute for an int column), as a signed 32-bit int."""
    k1 = (value & _MASK) * 0xCC9E2D51 & _MASK
    k1 = _rotl(k1, 15) * 0x1B873593 & _MASK
    h1 = (seed & _MASK) ^ k1
    h1 = (_rotl(h1, 13) * 5 + 0xE6546B64) & _MASK
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & _MASK
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & _MASK
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


@functools.cache
def task_labels(buckets: int) -> tuple[int, ...]:
    """``labels[b]``: the smallest int >= 0 that Spark's hash partitioning over ``buckets``
    partitions sends to partition ``b``. Cached: a step asks three times (the bucket
    column, the split keys' owners, reading the loads back), every step asks again."""
    if buckets < 1:
        raise ValueError(f"task_labels: expected at least 1 bucket, found {buckets}")
    labels: dict[int, int] = {}
    candidate = 0
    while len(labels) < buckets:
        labels.setdefault(murmur3_int(candidate) % buckets, candidate)
        candidate += 1
    return tuple(labels[b] for b in range(buckets))


@dataclass(frozen=True)
class BucketLoad:
    """What one bucket held and saw in one step (FastJoin Eq. 3-4 per bucket).

    ``stored`` = |R_i|: the state rows it holds (pending tuples, cache rows);
    ``probes`` = phi_si: the rows that probe them (new tuples, master partition rows);
    ``keys``: the bucket's heaviest keys by hash, each with its own share of both."""

    bucket: int
    stored: int
    probes: int
    keys: tuple[KeyLoad, ...] = ()

    @property
    def load(self) -> int:
        """Eq. 1."""
        return self.stored * self.probes

    @property
    def rest(self) -> InstanceLoad:
        """The part of the bucket its reported keys do not account for: it stays."""
        return InstanceLoad(
            self.stored - sum(k.stored for k in self.keys),
            self.probes - sum(k.probes for k in self.keys),
        )


@dataclass(frozen=True)
class Rebalance:
    """One monitor pass: the imbalance before and after (of the load model), the moves and
    the hot keys split over several buckets."""

    before: float
    after: float
    migrations: tuple[Migration, ...]
    splits: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def moved_keys(self) -> int:
        return sum(len(m.keys) for m in self.migrations)

    @property
    def moved_tuples(self) -> int:
        """Migration volume: the stored rows that change bucket."""
        return sum(m.tuples for m in self.migrations)


@dataclass(frozen=True)
class KeyRouting:
    """``B`` buckets, the keys moved away from their home bucket (hash -> bucket), and the
    hot keys split over several buckets (hash -> the buckets beside its own).

    A split key keeps one *owner* bucket (:meth:`bucket`), which holds its cache entry,
    counters and s_B; its stream tuples (new and waiting in H_S) spread over the owner and
    its replicas by a hash of the tuple, and each of them gets a copy of the rows a tuple
    needs this step (the key's cache rows, the master's changes to them, the master
    partition rows). A replica answers its share of the tuples and keeps its waiting ones;
    its counters go to the owner through the state, and it keeps no cache or s_B entry of
    the key (``joins.ssbj.buckets``). The owner decides the key's switch into the cache
    (line 33) from its own share of H_S: a deviation from the paper, which sees all of it.
    """

    buckets: int
    moved: tuple[tuple[int, int], ...] = field(default=())
    split: tuple[tuple[int, tuple[int, ...]], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.buckets < 1:
            raise ValueError(f"KeyRouting: expected at least 1 bucket, found {self.buckets}")
        for key_hash, bucket in self.moved:
            self._check_bucket(key_hash, bucket)
            if bucket == self.home(key_hash):
                raise ValueError(f"KeyRouting: key hash {key_hash} is moved to its own home")
        for table in (self.moved, self.split):
            hashes = [h for h, _ in table]
            if hashes != sorted(set(hashes)):
                raise ValueError("KeyRouting: expected keys sorted by hash, each once")
        for key_hash, replicas in self.split:
            for bucket in replicas:
                self._check_bucket(key_hash, bucket)
            if not replicas or len(set(replicas)) != len(replicas):
                raise ValueError(
                    f"KeyRouting: key hash {key_hash} split over {list(replicas)}: expected "
                    "distinct replica buckets"
                )
            if self.bucket(key_hash) in replicas:
                raise ValueError(f"KeyRouting: key hash {key_hash} is its own replica")

    def _check_bucket(self, key_hash: int, bucket: int) -> None:
        if not 0 <= bucket < self.buckets:
            raise ValueError(
                f"KeyRouting: key hash {key_hash} routed to bucket {bucket}, expected one of "
                f"0..{self.buckets - 1}"
            )

    def home(self, key_hash: int) -> int:
        return key_hash % self.buckets  # Python's % of a positive modulus is Spark's pmod

    def bucket(self, key_hash: int) -> int:
        """The key's owner: the bucket that holds its state."""
        return dict(self.moved).get(key_hash, self.home(key_hash))

    def targets(self, key_hash: int) -> tuple[int, ...]:
        """The buckets the key's new tuples spread over: its owner first."""
        return (self.bucket(key_hash), *dict(self.split).get(key_hash, ()))

    def with_moves(self, moves: Mapping[int, int], limit: int) -> KeyRouting:
        """This routing with ``moves`` applied; a key moved home leaves the table, and past
        ``limit`` entries the ones moved longest ago go home (any move is safe between
        steps, see the module docstring). Splits of moved keys are dropped."""
        table = {h: b for h, b in self.moved if h not in moves}
        order = [h for h, _ in self.moved if h not in moves]
        for key_hash, bucket in moves.items():
            if bucket != self.home(key_hash):
                table[key_hash] = bucket
                order.append(key_hash)
        for key_hash in order[: max(0, len(order) - limit)]:
            table.pop(key_hash, None)
        split = tuple((h, r) for h, r in self.split if h not in moves)
        return KeyRouting(self.buckets, tuple(sorted(table.items())), split)

    def with_splits(self, splits: Mapping[int, Sequence[int]]) -> KeyRouting:
        """This routing with exactly ``splits`` (hash -> replica buckets) as its split keys.

        A replica that is the key's owner under this routing is left out (the owner takes
        a share anyway), and a key left with no replica is not split: a move the table's
        cap sent home can make a planned replica the owner."""
        kept = {}
        for key_hash, replicas in splits.items():
            others = tuple(b for b in replicas if b != self.bucket(key_hash))
            if others:
                kept[key_hash] = others
        return KeyRouting(self.buckets, self.moved, tuple(sorted(kept.items())))

    def to_dict(self) -> dict[str, Any]:
        return {
            "buckets": self.buckets,
            "moved": [[h, b] for h, b in self.moved],
            "split": [[h, list(r)] for h, r in self.split],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KeyRouting:
        try:
            return cls(
                int(data["buckets"]),
                tuple((int(h), int(b)) for h, b in data["moved"]),
                tuple((int(h), tuple(int(b) for b in r)) for h, r in data.get("split", [])),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"KeyRouting.from_dict: not a saved routing: {e}") from e


def plan_splits(
    routing: KeyRouting, loads: Sequence[BucketLoad], factor: float, ways: int | None = None
) -> dict[int, tuple[int, ...]]:
    """Hot keys to split, and their replica buckets.

    A key whose probes (new tuples and master rows, summed over the buckets that report
    it) exceed ``factor`` times the mean bucket's probes cannot be balanced by moving it
    whole: it is split over ``d = ceil(probes / mean)`` buckets (at most B, and at most
    ``ways``), its owner and the ``d - 1`` buckets with the fewest probes of other keys.
    ``ways = 2`` is STA's Algorithm 2 for hot keys (two choices, the key's own instance
    and the least loaded other); every replica costs a copy of the key's master rows, so
    ``ways`` bounds that copying. Deterministic."""
    if factor < 1:
        raise ValueError(f"plan_splits: expected a factor >= 1, found {factor}")
    if ways is not None and ways < 2:
        raise ValueError(f"plan_splits: expected ways >= 2 (or none), found {ways}")
    total = sum(b.probes for b in loads)
    if total == 0 or routing.buckets < 2:
        return {}
    mean = total / routing.buckets
    per_key: dict[int, int] = {}
    for b in loads:
        for k in b.keys:
            per_key[_hash(k.key)] = per_key.get(_hash(k.key), 0) + k.probes
    hot = {h: p for h, p in per_key.items() if p > factor * mean}
    if not hot:
        return {}
    other = [0] * routing.buckets
    for b in loads:
        other[b.bucket] += b.probes - sum(k.probes for k in b.keys if _hash(k.key) in hot)
    splits: dict[int, tuple[int, ...]] = {}
    for key_hash, probes in sorted(hot.items(), key=lambda kv: (-kv[1], kv[0])):
        owner = routing.bucket(key_hash)
        d = min(routing.buckets, math.ceil(probes / mean), ways or routing.buckets)
        spare = sorted(
            (i for i in range(routing.buckets) if i != owner), key=lambda i: (other[i], i)
        )
        replicas = tuple(sorted(spare[: d - 1]))
        for target in (owner, *replicas):
            other[target] += probes // d
        if replicas:
            splits[key_hash] = replicas
    return splits


def rebalance(
    routing: KeyRouting,
    loads: Sequence[BucketLoad],
    theta: float,
    method: Method = "greedyfit",
    theta_gap: int = 0,
    seed: int = 0,
    split_factor: float | None = None,
    split_ways: int | None = None,
) -> Rebalance:
    """The monitor: LI over all buckets (Eq. 2; a bucket that reported nothing has load 0)
    and, when it exceeds ``theta``, the migrations that bring it down. With
    ``split_factor``, keys too hot to move whole are split first (:func:`plan_splits`) and
    stay out of the migrations; their loads are spread over their buckets for the rest
    (over at most ``split_ways`` buckets each)."""
    if method not in METHODS:
        raise ValueError(f"rebalance: expected a method in {METHODS}, found {method!r}")
    by_bucket = {b.bucket: b for b in loads}
    unknown = sorted(set(by_bucket) - set(range(routing.buckets)))
    if unknown:
        raise ValueError(f"rebalance: loads of buckets {unknown}, routing has {routing.buckets}")
    every = [by_bucket.get(b, BucketLoad(b, 0, 0)) for b in range(routing.buckets)]
    before = imbalance([b.load for b in every])
    splits = (
        plan_splits(routing, every, split_factor, split_ways) if split_factor is not None else {}
    )
    if splits:
        every = spread_loads(every, routing.with_splits(splits), splits)
    # No migration when the (spread) loads are within theta: plan_rebalance checks first.
    migrations = plan_rebalance(
        [list(b.keys) for b in every],
        theta,
        theta_gap,
        rest=[b.rest for b in every],
        chooser=None if method == "greedyfit" else random.Random(seed),
    )
    after = imbalance(_loads_after(every, migrations))
    return Rebalance(before, after, tuple(migrations), _pairs(splits))


def _pairs(splits: Mapping[int, tuple[int, ...]]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    return tuple(sorted(splits.items()))


def spread_loads(
    every: Sequence[BucketLoad], routing: KeyRouting, splits: Mapping[int, tuple[int, ...]]
) -> list[BucketLoad]:
    """The loads once split keys spread: a split key's probes shared evenly by its
    buckets, its stored rows at its owner; split keys are no longer candidates to move."""
    stored = [b.stored for b in every]
    probes = [b.probes for b in every]
    totals: dict[int, tuple[int, int]] = {}
    for b in every:
        for k in b.keys:
            h = _hash(k.key)
            if h in splits:
                stored[b.bucket] -= k.stored
                probes[b.bucket] -= k.probes
                s, p = totals.get(h, (0, 0))
                totals[h] = (s + k.stored, p + k.probes)
    for h, (s, p) in totals.items():
        targets = routing.targets(h)
        stored[targets[0]] += s
        for i, target in enumerate(targets):
            probes[target] += p // len(targets) + (1 if i < p % len(targets) else 0)
    return [
        BucketLoad(
            b.bucket,
            stored[b.bucket],
            probes[b.bucket],
            tuple(k for k in b.keys if _hash(k.key) not in splits),
        )
        for b in every
    ]


def _loads_after(every: Sequence[BucketLoad], migrations: Sequence[Migration]) -> list[int]:
    """Eq. 1 per bucket once ``migrations`` have moved their keys."""
    stored = [b.stored for b in every]
    probes = [b.probes for b in every]
    keys = {k.key: k for b in every for k in b.keys}
    for m in migrations:
        moved = [keys[k] for k in m.keys]
        for sign, bucket in ((-1, m.source), (1, m.target)):
            stored[bucket] += sign * sum(k.stored for k in moved)
            probes[bucket] += sign * sum(k.probes for k in moved)
    return [s * p for s, p in zip(stored, probes, strict=True)]


def _hash(key: object) -> int:
    """A key of the load reports: a key hash (an int), as the buckets report it."""
    if not isinstance(key, int):
        raise ValueError(f"expected a key hash (int) in the bucket loads, found {key!r}")
    return key


def moves_of(migrations: Sequence[Migration]) -> dict[int, int]:
    """Key hash -> its new bucket, the last migration of a key winning."""
    moves: dict[int, int] = {}
    for m in migrations:
        for key in m.keys:
            moves[_hash(key)] = m.target
    return moves
