"""One loop iteration of SSBJ's Algorithm 1 over the state of one key bucket.

Source: seeds/ssbj_semi_stream_balanced_join.txt, Algorithm 1 (line numbers below are the
paper's). The operator's state is split by a hash of the join value into buckets; every
decision of Algorithm 1 (cache probe, disk probe, s_count, the cache inequality, eviction)
concerns one join value, so running the iteration bucket by bucket is the same algorithm.
The Spark side (``joins.ssbj.step``) ships each bucket's rows here as Arrow
(``joins.ssbj.buckets``); this module is plain Python.

State of a bucket (:class:`BucketState`):

- H_S: the pending stream tuples, each with its entry step (its chunk in the queue Q), the
  master version it is pinned to, and (left joins, and steps that keep late tuples, which
  run as left joins) whether it has met a master row;
- H_R: the cache, every master row of each cached join value at the cache's version; a value
  with no master rows is cached as an empty entry (the paper's negative cache);
- per value: f_count since the last eviction pass, s_count and the partitions it was counted
  in over the last incrementing cycle;
- s_B: the values marked for switching and the master rows collected for them so far.

Invariants, for any sequence of steps with k partitions:

- every stream tuple is answered exactly once: at its entry step from H_R (lines 15–23), or
  by the disk phase, which meets partition ``step mod k`` of the tuple's pinned version at
  each of the k steps it stays in H_S (lines 24–27, 39–41); a left-join tuple that met no
  row is emitted unmatched when it leaves H_S;
- an H_R entry holds all master rows of its value at the plan's master version (the cache is
  brought forward by the master's changes before it serves, and s_B is moved in whole);
- a join value with a null component matches nothing (SQL equality) and is never cached;
  NaN equals NaN, as in Spark's and DuckDB's joins (:func:`join_value`).

Where this differs from the paper, and why: the eviction pass runs at the first step of an
eviction cycle instead of its end (both see f_count over the E cycles since the previous
pass); s_count is reset right after line 33, its only reader, at the first step of the
switching cycle (the paper resets it at phase-out, line 12: the same counts reach line 33,
and the counters of the values without hits are not carried through the switching and
phase-out cycles); pending tuples of a value moved into H_R stay in
H_S until their cycle completes (removing them early would lose the partitions they have
not met yet). Beyond the paper, the instrumentation can be bounded to a set of tracked
values (``run_step``'s ``tracked``: the ASketch filter of ``operator.key_counts: sketch``);
untracked values are never cached, which changes where they are answered, not the answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from joins.ssbj.cache.inequality import (
    TupleSizes,
    estimated_master_rows,
    should_evict,
    should_switch_into_cache,
)
from joins.ssbj.cache.rcycle import CycleState, StepPosition

Row = tuple[Any, ...]
Key = tuple[Any, ...]

ESTIMATORS = ("paper", "extrapolated")
# Every NaN component of a join value becomes this one object: Python compares and hashes
# NaN by identity, so without it two NaN keys would never meet, where Spark's and DuckDB's
# equi-joins match them.
CANONICAL_NAN = float("nan")


def join_value(row: Row, positions: Sequence[int]) -> Key:
    """The join value of ``row`` at ``positions``, NaN components made one object."""
    # v != v holds for NaN alone (of floats and Decimals), and costs less than isnan()'s
    # type checks on every tuple.
    return tuple(
        CANONICAL_NAN if v != v else v  # noqa: PLR0124
        for v in map(row.__getitem__, positions)
    )


@dataclass(frozen=True)
class StepPlan:
    """What one step of every bucket does; the same for all buckets of the step.

    ``step`` is the operator's step number (entry steps are recorded in it); ``position``
    places the step in the R-cycle machine, counted from the last change of k.
    """

    step: int
    position: StepPosition
    master_version: int
    stream_key: tuple[int, ...]  # positions of the join columns in a stream row
    master_key: tuple[int, ...]  # positions of the join columns in a master row
    sizes: TupleSizes
    use_cache: bool = True  # False: MESHJOIN (no H_R, no instrumentation)
    left_join: bool = False
    switch_factor: float = 1.0
    estimator: str = "extrapolated"
    # The master version s_B collects rows of this step (the version in force when the
    # values were marked), or None when no switching cycle is collecting.
    switch_version: int | None = None
    # Versions whose partition ``step mod k`` this step's bucket input holds.
    partition_versions: frozenset[int] = frozenset()
    # The stored state holds each value's counters and s_B mark once: the step that wrote
    # it had no split keys (whose replicas each keep their own). False: not known, and a
    # pass merges them (``decode_state``; the columnar pass checks).
    one_row_per_value: bool = False

    def __post_init__(self) -> None:
        if len(self.stream_key) != len(self.master_key) or not self.stream_key:
            raise ValueError(
                f"join needs as many stream as master key columns (at least one), got "
                f"{len(self.stream_key)} and {len(self.master_key)}"
            )
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        needed = {self.master_version} if self.use_cache else set()
        if self.switch_version is not None:
            needed.add(self.switch_version)
        if not needed <= self.partition_versions:
            raise ValueError(
                f"step {self.position.step} needs the partitions of master versions "
                f"{sorted(needed)}, the plan holds {sorted(self.partition_versions)}"
            )

    def expiring_entry_step(self) -> int | None:
        """Tuples that entered at this step have met all k partitions now.

        Only that chunk leaves: a tuple claiming an older entry step breaks the queue's
        invariant and stays, where the audit's freshness check reports it, rather than
        being answered before it met every partition."""
        relative = self.position.expiring_entry_step()
        return None if relative is None else relative + self.step - self.position.step

    @property
    def cycle_state(self) -> CycleState:
        return self.position.state

    def stream_key_of(self, row: Row) -> Key:
        return join_value(row, self.stream_key)

    def master_key_of(self, row: Row) -> Key:
        return join_value(row, self.master_key)


@dataclass(frozen=True)
class Schedule:
    """What a step reads beside its new tuples and the state, from the controller's state.

    - ``partition_versions``: the master versions whose partition ``step mod k`` the step
      meets: every pending chunk's pinned version, the current version (new tuples pin to
      it; the instrumentation counts over it), and s_B's version while a switching cycle
      collects;
    - ``cache_from`` / ``switch_from``: the versions H_R and s_B must be brought forward
      from (None when already current or not needed).
    """

    switching_starts: bool
    phase_out_starts: bool
    collecting: int | None
    partition_versions: frozenset[int]
    cache_from: int | None
    switch_from: int | None

    def next_switch_version(self, current: int | None, master_version: int) -> int | None:
        """s_B's version after the step: set when values are marked, cleared when moved."""
        if self.switching_starts:
            return master_version
        if self.phase_out_starts:
            return None
        return current


def schedule(
    position: StepPosition,
    master_version: int,
    use_cache: bool,
    takes_input: bool,
    chunk_versions: Iterable[int],
    cache_version: int | None,
    switch_version: int | None,
) -> Schedule:
    """The reads of one step (Algorithm 1's lines 3–14 decide what the iteration does)."""
    starts = use_cache and position.starts_cycle
    switching_starts = starts and position.state is CycleState.SWITCHING
    phase_out_starts = starts and position.state is CycleState.PHASE_OUT
    collecting: int | None = None
    if switching_starts:
        collecting = master_version
    elif use_cache and position.state is CycleState.SWITCHING:
        collecting = switch_version
    versions = set(chunk_versions)
    if use_cache or takes_input:
        versions.add(master_version)
    if collecting is not None:
        versions.add(collecting)

    def stale(version: int | None) -> int | None:
        return version if version is not None and version != master_version else None

    return Schedule(
        switching_starts=switching_starts,
        phase_out_starts=phase_out_starts,
        collecting=collecting,
        partition_versions=frozenset(versions),
        cache_from=stale(cache_version) if use_cache else None,
        switch_from=stale(switch_version) if phase_out_starts else None,
    )


@dataclass(slots=True)
class PendingTuple:
    """A stream tuple in H_S, with its place in the queue Q."""

    row: Row
    key: Key
    entry_step: int
    pinned_version: int
    matched: bool = False


@dataclass(slots=True)
class KeyCounters:
    """The instrumentation of one join value."""

    hits: int = 0  # f_count (line 19) since the last eviction pass
    master_rows: int = 0  # s_count (line 29) over the last incrementing cycle
    observed: int = 0  # partitions of that cycle in which the value was pending

    def is_zero(self) -> bool:
        return self.hits == 0 and self.master_rows == 0 and self.observed == 0


@dataclass
class BucketState:
    pending: list[PendingTuple] = field(default_factory=list)
    cache: dict[Key, list[Row]] = field(default_factory=dict)
    counters: dict[Key, KeyCounters] = field(default_factory=dict)
    switch_buffer: dict[Key, list[Row]] = field(default_factory=dict)


@dataclass(frozen=True)
class RowChanges:
    """The master rows that commits between two versions removed and added."""

    removed: Sequence[Row]
    added: Sequence[Row]


@dataclass(frozen=True)
class Reload:
    """All master rows (of this bucket) at the new version: for commits that do not say
    which rows changed (an overwrite or a compaction without a change data feed)."""

    rows: Sequence[Row]


MasterDelta = RowChanges | Reload


@dataclass
class StepCounts:
    tuples_in: int = 0
    cache_hits: int = 0
    cache_hits_unmatched: int = 0
    entered_pending: int = 0
    expired: int = 0
    output_rows: int = 0
    pending_rows: int = 0
    cache_rows: int = 0  # H_R rows, an empty entry counting as one
    counter_rows: int = 0  # join values with counters (f_count, s_count) after the step
    switch_rows: int = 0  # master rows s_B holds after the step (line 34; H_R's at line 10)
    # Of the counts above, the tuples returning from the late rows (``run_step``'s
    # ``returning``): in, answered from H_R, and answered there without a row.
    returned: int = 0
    returned_hits: int = 0
    returned_hits_unmatched: int = 0


Output = tuple[Row, Row | None, int | None]
"""(stream row, master row, master version); (stream row, None, None) for unmatched rows."""


@dataclass
class StepResult:
    output: list[Output]
    state: BucketState
    counts: StepCounts


def has_null(key: Key) -> bool:
    return None in key


def by_key(rows: Iterable[Row], plan: StepPlan) -> dict[Key, list[Row]]:
    index: dict[Key, list[Row]] = {}
    for row in rows:
        key = plan.master_key_of(row)
        if not has_null(key):
            index.setdefault(key, []).append(row)
    return index


def brought_forward(
    entries: dict[Key, list[Row]], delta: MasterDelta | None, plan: StepPlan
) -> dict[Key, list[Row]]:
    """Complete entries of an older master version brought to the plan's version.

    Removed rows leave as a multiset difference, added rows of tracked values join; a value
    left without rows stays as an empty entry. Untracked values are not added.
    """
    if delta is None or not entries:
        return entries
    if isinstance(delta, Reload):
        current = by_key(delta.rows, plan)
        return {key: list(current.get(key, ())) for key in entries}
    result = {key: list(rows) for key, rows in entries.items()}
    for row in delta.removed:
        rows = result.get(plan.master_key_of(row))
        if rows is not None and row in rows:
            rows.remove(row)
    for row in delta.added:
        rows = result.get(plan.master_key_of(row))
        if rows is not None:
            rows.append(row)
    return result


def _reset_s_count(counters: Mapping[Key, KeyCounters]) -> None:
    """Line 12: every value's s_count and the partitions it was counted over back to 0."""
    for c in counters.values():
        c.master_rows = c.observed = 0


def _nonzero(counters: Mapping[Key, KeyCounters]) -> dict[Key, KeyCounters]:
    """The values with some counter above zero."""
    return {key: c for key, c in counters.items() if not c.is_zero()}


def run_step(
    plan: StepPlan,
    state: BucketState,
    new_tuples: Sequence[Row],
    partitions: Mapping[int, Sequence[Row]],
    cache_delta: MasterDelta | None = None,
    switch_delta: MasterDelta | None = None,
    tracked: frozenset[Key] | None = None,
    spread: Mapping[Key, int] | None = None,
    returning: Sequence[Row] = (),
) -> StepResult:
    """One iteration of Algorithm 1's outer loop (lines 3–51) for one bucket.

    ``partitions`` maps each of ``plan.partition_versions`` to the bucket's rows of master
    partition ``step mod k`` at that version (a version may be absent when the bucket has no
    rows there). ``cache_delta`` brings H_R from its version to the plan's; ``switch_delta``
    brings s_B from the version it was collected at, for a phase-out that moves it.

    ``tracked``, when given, bounds the instrumentation for key domains too large to
    count every value: only tracked values get s_count (lines 28–29) and are weighed for
    switching (line 33); the operator passes the values its ASketch finds most frequent in
    the stream (``joins.skew.asketch``). Untracked values stay on the disk side, which answers
    them exactly; cached values keep their f_count. ``None`` counts every pending value,
    as the paper does.

    ``spread`` maps a value whose tuples are split evenly over several buckets (this one
    its owner, ``joins.skew.key_routing``) to the number of those buckets: the owner holds that
    share of the value's H_S, so line 33 weighs ``|H_S(j)|`` times it, the value's whole
    H_S, as the unsplit value would be weighed.

    ``returning`` (beyond the paper) are tuples that met no master row at an older version
    and come back for the plan's newer one (``operator.late_master``,
    ``joins.ssbj.late``): each is a new tuple of this step, probing H_R then entering H_S
    for a cycle at the plan's version, and is counted in the ``returned*`` counts too.
    """
    counts = StepCounts()
    output: list[Output] = []
    pending = state.pending
    for tup in pending:
        if tup.pinned_version not in plan.partition_versions:
            raise ValueError(
                f"step {plan.step}: a pending tuple is pinned to master version "
                f"{tup.pinned_version}, whose partition the plan does not hold "
                f"({sorted(plan.partition_versions)})"
            )
    cache, counters, buffer = _start_cycle(plan, state, cache_delta, switch_delta)
    _cache_phase(plan, cache, counters, pending, returning, new_tuples, output, counts)
    position = plan.position
    if plan.use_cache and position.starts_cycle and position.state is CycleState.SWITCHING:
        counters = _choose_switches(plan, cache, counters, buffer, pending, tracked, spread)
    index = {v: by_key(partitions.get(v, ()), plan) for v in plan.partition_versions}
    _disk_phase(plan, index, counters, buffer, pending, tracked, output)
    kept = _expire(plan, pending, output, counts)
    counts.output_rows = len(output)
    counts.pending_rows = len(kept)
    counts.cache_rows = sum(max(1, len(rows)) for rows in cache.values())
    counts.counter_rows = len(counters)
    counts.switch_rows = sum(len(rows) for rows in buffer.values())
    return StepResult(output, BucketState(kept, cache, counters, buffer), counts)


def _start_cycle(
    plan: StepPlan,
    state: BucketState,
    cache_delta: MasterDelta | None,
    switch_delta: MasterDelta | None,
) -> tuple[dict[Key, list[Row]], dict[Key, KeyCounters], dict[Key, list[Row]]]:
    """H_R brought to the plan's version, and at a cycle's start lines 9–12: s_B moved into
    H_R (phase-out), the eviction test (lines 42–49), s_count restarted (incrementing).
    Returns (H_R, the counters, s_B)."""
    position = plan.position
    cache = brought_forward(state.cache, cache_delta, plan) if plan.use_cache else {}
    counters = state.counters
    buffer = state.switch_buffer
    if not (plan.use_cache and position.starts_cycle):
        return cache, counters, buffer
    if position.state is CycleState.PHASE_OUT and buffer:
        # Lines 9–10: s_B holds every row of each marked value (the switching cycle met
        # all k partitions); it moves into H_R whole, at the plan's version.
        cache.update(brought_forward(buffer, switch_delta, plan))
        buffer = {}
    if position.evicts:
        # Lines 42–49: m_cache = |H_R(j)|·v_R against m_disk = f_count/E·v_S.
        for key in [k for k in cache]:
            hits = counters[key].hits if key in counters else 0
            if should_evict(
                len(cache[key]),
                hits,
                plan.sizes,
                plan.switch_factor,
                position.eviction_cycles,
            ):
                del cache[key]
        for c in counters.values():
            c.hits = 0
    if position.state is CycleState.INCREMENTING:
        # Line 12: s_count restarts with the cycle (zero already since line 33 reset
        # it, unless the state was saved before that reset moved there).
        _reset_s_count(counters)
    return cache, _nonzero(counters), buffer


def _cache_phase(
    plan: StepPlan,
    cache: Mapping[Key, list[Row]],
    counters: dict[Key, KeyCounters],
    pending: list[PendingTuple],
    returning: Sequence[Row],
    new_tuples: Sequence[Row],
    output: list[Output],
    counts: StepCounts,
) -> None:
    """Lines 15–23: each tuple (the returning ones first) probes H_R; a hit is answered at
    once (line 18) and counted (line 19), a miss enters H_S (line 21)."""
    version = plan.master_version
    returned = len(returning)
    for n, row in enumerate(chain(returning, new_tuples)):
        counts.tuples_in += 1
        key = plan.stream_key_of(row)
        entry = cache.get(key) if plan.use_cache and not has_null(key) else None
        if entry is None:
            pending.append(PendingTuple(row, key, plan.step, version))  # line 21
            counts.entered_pending += 1
            continue
        counts.cache_hits += 1
        counters.setdefault(key, KeyCounters()).hits += 1  # line 19
        if entry:
            output.extend((row, master, version) for master in entry)  # line 18
        elif plan.left_join:
            output.append((row, None, None))
            counts.cache_hits_unmatched += 1
        if n < returned:
            counts.returned_hits += 1
            counts.returned_hits_unmatched += 0 if entry or not plan.left_join else 1
    counts.returned = returned


def _choose_switches(
    plan: StepPlan,
    cache: Mapping[Key, list[Row]],
    counters: dict[Key, KeyCounters],
    buffer: dict[Key, list[Row]],
    pending: Sequence[PendingTuple],
    tracked: frozenset[Key] | None,
    spread: Mapping[Key, int] | None,
) -> dict[Key, KeyCounters]:
    """Line 33, once per value at the start of the switching cycle, over H_S with this
    step's chunk: mark j for s_B when |H_S(j)|·v_S > s_f·s_count(j)·v_R. Returns the
    counters left: s_count reset, only values with hits kept."""
    position = plan.position
    waiting = Counter(t.key for t in pending if not has_null(t.key))
    for key, tuples in waiting.items():
        if key in cache or key in buffer or (tracked is not None and key not in tracked):
            continue
        counted = counters.get(key)
        if plan.estimator == "extrapolated":
            if counted is None:
                continue  # never counted: its master rows are not known yet
            estimate = estimated_master_rows(
                counted.master_rows, counted.observed, position.partitions
            )
            if estimate is None:
                continue  # no row counted over part of the cycle: it stays in H_S
        else:
            estimate = counted.master_rows if counted is not None else 0
        whole = tuples * spread.get(key, 1) if spread else tuples
        if should_switch_into_cache(whole, estimate, plan.sizes, plan.switch_factor):
            buffer[key] = []
    # Line 33 was s_count's last reader until the next incrementing cycle counts it
    # afresh: it is reset here, and only values with hits keep their counters.
    _reset_s_count(counters)
    return _nonzero(counters)


def _disk_phase(
    plan: StepPlan,
    index: Mapping[int, Mapping[Key, list[Row]]],
    counters: dict[Key, KeyCounters],
    buffer: dict[Key, list[Row]],
    pending: Sequence[PendingTuple],
    tracked: frozenset[Key] | None,
    output: list[Output],
) -> None:
    """Lines 24–27: each pending tuple meets this partition of its version; lines 28–29
    count s_count (incrementing); line 34 fills s_B with the marked values' rows
    (switching)."""
    for tup in pending:
        if has_null(tup.key):
            continue
        matches = index[tup.pinned_version].get(tup.key)
        if matches:
            output.extend((tup.row, master, tup.pinned_version) for master in matches)
            # Only a left join reads the flag; an inner join's H_S rows stay as they
            # entered, so a chunk the step did not change is not rewritten.
            tup.matched = tup.matched or plan.left_join
    if not plan.use_cache:
        return
    state = plan.position.state
    if state is CycleState.INCREMENTING:
        current = index[plan.master_version]
        for key in {t.key for t in pending if not has_null(t.key)}:
            if tracked is not None and key not in tracked:
                continue
            c = counters.setdefault(key, KeyCounters())
            c.master_rows += len(current.get(key, ()))
            c.observed += 1
    if state is CycleState.SWITCHING and plan.switch_version is not None:
        source = index[plan.switch_version]
        for key, rows in buffer.items():
            rows.extend(source.get(key, ()))


def _expire(
    plan: StepPlan, pending: Sequence[PendingTuple], output: list[Output], counts: StepCounts
) -> list[PendingTuple]:
    """Lines 39–41: the chunk that has now met all k partitions leaves H_S (a left join
    answers its unmatched tuples with nulls). Returns H_S after the step."""
    expiring = plan.expiring_entry_step()
    kept: list[PendingTuple] = []
    for tup in pending:
        if tup.entry_step == expiring:
            counts.expired += 1
            if plan.left_join and not tup.matched:
                output.append((tup.row, None, None))
        else:
            kept.append(tup)
    return kept
