"""GreedyFit and SAFit: which keys to move from the heaviest join instance to the lightest.

FastJoin (seeds/fastjoin_skew_aware_stream_join.txt), Section III. An instance ``i`` stores
``|R_i|`` tuples of the stored stream and sees ``phi_si`` probing tuples of the other; per
key ``k`` these are ``|R_ik|`` and ``phi_sik`` (Eq. 3-4).

- Load (Eq. 1): ``L_i = |R_i| * phi_si``.
- Imbalance (Eq. 2): ``LI = L_heaviest / L_lightest``; migration is due when ``LI`` exceeds
  the threshold ``Theta`` (:func:`imbalance`, :func:`plan_rebalance`).
- Migration benefit of a key (Eq. 7-8): how much moving all of ``k`` from ``i`` to ``j``
  narrows the gap ``L_i - L_j``:
  ``F_k = (|R_i| + |R_j|) * phi_sik + (phi_si + phi_sj) * |R_ik|``.
  The gap after moving a key set ``SK`` is exactly ``L_i - L_j - sum(F_k)`` (Eq. 9: the
  cross terms of the two products cancel), so benefits add up.
- Migration key factor (Definition 2): ``F_k / |R_ik|``, benefit per tuple moved.

:func:`greedy_fit` is Algorithm 1: keys by descending key factor, each taken when it fits
in the remaining gap (``Gap > F_k``) and is worth it (``F_k >= theta_gap``). Invariant: the
target never ends heavier than the source (``Delta L > 0``, Eq. 9), and the gap shrinks by
exactly the benefits taken. :func:`sa_fit` is Algorithm 3 (simulated annealing over the
same constraint, valued by Eq. 10, accepting a worse solution with the Metropolis
probability of Eq. 11), for comparison. Both are deterministic given their inputs (SAFit
takes a seeded ``random.Random``).

Keys a tuple is counted under must be known exactly per instance (here: per SSBJ key bucket
or A-DSP task); :func:`plan_rebalance` repeats the heaviest-to-lightest step, as the
monitor does, until ``LI <= Theta`` or no key can move.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

Key = Hashable


@dataclass(frozen=True)
class KeyLoad:
    """One key on one instance: ``stored`` = ``|R_ik|``, ``probes`` = ``phi_sik``."""

    key: Key
    stored: int
    probes: int

    def __post_init__(self) -> None:
        if self.stored < 0 or self.probes < 0:
            raise ValueError(
                f"key {self.key!r}: expected stored and probe counts >= 0, found "
                f"{self.stored} and {self.probes}"
            )


@dataclass(frozen=True)
class InstanceLoad:
    """One join instance: ``|R_i|`` and ``phi_si`` (Eq. 3-4)."""

    stored: int
    probes: int

    @property
    def load(self) -> int:
        """Eq. 1."""
        return self.stored * self.probes

    @classmethod
    def of(cls, keys: Sequence[KeyLoad]) -> InstanceLoad:
        return cls(sum(k.stored for k in keys), sum(k.probes for k in keys))


@dataclass(frozen=True)
class Migration:
    """Move ``keys`` from instance ``source`` to ``target``; ``benefit`` = sum of F_k."""

    source: int
    target: int
    keys: tuple[Key, ...]
    benefit: int
    tuples: int  # |R_ik| summed: the stored tuples that move


def imbalance(loads: Sequence[int]) -> float:
    """Eq. 2; an idle instance beside a busy one is infinitely imbalanced, all idle is 1."""
    if not loads:
        raise ValueError("imbalance: expected at least one instance")
    heaviest, lightest = max(loads), min(loads)
    if heaviest == 0:
        return 1.0
    return math.inf if lightest == 0 else heaviest / lightest


def migration_benefit(key: KeyLoad, source: InstanceLoad, target: InstanceLoad) -> int:
    """Eq. 8."""
    return (source.stored + target.stored) * key.probes + (
        source.probes + target.probes
    ) * key.stored


def greedy_fit(
    keys: Sequence[KeyLoad],
    source: InstanceLoad,
    target: InstanceLoad,
    theta_gap: int = 0,
) -> list[KeyLoad]:
    """Algorithm 1: the keys to move from ``source`` to ``target``."""
    gap = source.load - target.load
    scored = [(migration_benefit(k, source, target), k) for k in keys]
    # Descending key factor F_k / |R_ik|; a key with no stored tuple costs nothing to move
    # (infinite factor). Ties: larger benefit first, then input order (a stable sort).
    scored.sort(key=lambda fk: (-(fk[0] / fk[1].stored) if fk[1].stored else -math.inf, -fk[0]))
    chosen = []
    for benefit, key in scored:
        if gap > benefit >= theta_gap and benefit > 0:
            gap -= benefit
            chosen.append(key)
    return chosen


def _value(keys: Sequence[KeyLoad], benefits: Mapping[Key, int]) -> float:
    """Eq. 10: benefit per stored tuple moved (0 for the empty set)."""
    stored = sum(k.stored for k in keys)
    total = sum(benefits[k.key] for k in keys)
    if not keys:
        return 0.0
    return math.inf if stored == 0 else total / stored


def sa_fit(
    keys: Sequence[KeyLoad],
    source: InstanceLoad,
    target: InstanceLoad,
    rng: random.Random,
    temperature: float = 1.0,
    min_temperature: float = 1e-3,
    cooling: float = 0.9,
    iterations: int = 50,
) -> list[KeyLoad]:
    """Algorithm 3: simulated annealing over key sets whose benefit fits in the gap."""
    if not 0 < cooling < 1 or temperature <= 0 or min_temperature <= 0 or iterations < 1:
        raise ValueError(
            "sa_fit: expected 0 < cooling < 1, positive temperatures and iterations >= 1, "
            f"found cooling={cooling} T={temperature} T_min={min_temperature} L={iterations}"
        )
    gap = source.load - target.load
    benefits = {k.key: migration_benefit(k, source, target) for k in keys}
    if gap <= 0 or not keys:
        return []
    current: set[int] = set()
    total = 0
    for index in range(len(keys)):  # lines 4-14: a random initial set within the gap
        if rng.random() < 0.5:
            if total + benefits[keys[index].key] >= gap:
                break
            current.add(index)
            total += benefits[keys[index].key]

    def value(chosen: set[int]) -> float:
        return _value([keys[i] for i in sorted(chosen)], benefits)

    best, current_value = set(current), value(current)
    best_value = current_value
    while temperature > min_temperature:  # lines 17-40
        for _ in range(iterations):
            index = rng.randrange(len(keys))
            candidate = current ^ {index}
            if sum(benefits[keys[i].key] for i in candidate) >= gap:  # Eq. 9 must hold
                continue
            new_value = value(candidate)
            if new_value > current_value:
                current, current_value = candidate, new_value
                if new_value > best_value:
                    best, best_value = set(candidate), new_value
            # Eq. 11 (a finite value below an infinite one gives exp(-inf) = 0)
            elif new_value == current_value or rng.random() < math.exp(
                (new_value - current_value) / temperature
            ):
                current, current_value = candidate, new_value
        temperature *= cooling
    return [keys[i] for i in sorted(best)]


def apply_migration(
    instances: Sequence[Sequence[KeyLoad]], migration: Migration
) -> list[list[KeyLoad]]:
    """The instances' keys after ``migration`` (keys merge by identity on the target)."""
    moved = set(migration.keys)
    result = [list(keys) for keys in instances]
    leaving = [k for k in result[migration.source] if k.key in moved]
    result[migration.source] = [k for k in result[migration.source] if k.key not in moved]
    merged = {k.key: k for k in result[migration.target]}
    for key in leaving:
        known = merged.get(key.key)
        merged[key.key] = (
            key
            if known is None
            else KeyLoad(key.key, known.stored + key.stored, known.probes + key.probes)
        )
    result[migration.target] = list(merged.values())
    return result


def plan_rebalance(
    instances: Sequence[Sequence[KeyLoad]],
    theta: float,
    theta_gap: int = 0,
    max_migrations: int = 64,
    rest: Sequence[InstanceLoad] | None = None,
    chooser: random.Random | None = None,
) -> list[Migration]:
    """The monitor's loop: while ``LI > theta``, move keys from the heaviest instance to the
    lightest; stop when balanced or when no key can move.

    ``instances`` list the keys each instance may move; ``rest`` (default nothing) is the
    load of each instance's other tuples, which stays where it is. Keys are chosen by
    GreedyFit, or by SAFit when ``chooser`` (its random source) is given."""
    if theta < 1:
        raise ValueError(f"plan_rebalance: expected theta >= 1, found {theta}")
    fixed = list(rest) if rest is not None else [InstanceLoad(0, 0)] * len(instances)
    if len(fixed) != len(instances):
        raise ValueError(
            f"plan_rebalance: expected one rest load per instance ({len(instances)}), "
            f"found {len(fixed)}"
        )

    def total(i: int) -> InstanceLoad:
        keys = InstanceLoad.of(current[i])
        return InstanceLoad(keys.stored + fixed[i].stored, keys.probes + fixed[i].probes)

    current = [list(keys) for keys in instances]
    plan: list[Migration] = []
    for _ in range(max_migrations):
        loads = [total(i).load for i in range(len(current))]
        if len(loads) < 2 or imbalance(loads) <= theta:
            break
        source = max(range(len(loads)), key=lambda i: (loads[i], -i))
        target = min(range(len(loads)), key=lambda i: (loads[i], i))
        source_load, target_load = total(source), total(target)
        if chooser is None:
            chosen = greedy_fit(current[source], source_load, target_load, theta_gap)
        else:
            chosen = sa_fit(current[source], source_load, target_load, chooser)
        if not chosen:
            break
        migration = Migration(
            source,
            target,
            tuple(k.key for k in chosen),
            sum(migration_benefit(k, source_load, target_load) for k in chosen),
            sum(k.stored for k in chosen),
        )
        plan.append(migration)
        current = apply_migration(current, migration)
    return plan
