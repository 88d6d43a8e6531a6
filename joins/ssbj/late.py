"""SSBJ tuples that wait for master rows arriving after them (``operator.late_master``).

The plain join keeps such tuples in a late table and probes them at every step
(``pipeline.waiting_tuples``). SSBJ keeps them in its own state table, as rows of role
:data:`LATE`, and lets them take the path every tuple takes: a tuple that leaves H_S (or
meets an empty H_R entry) without a master row at its pinned version is not emitted
unmatched or dropped but kept as a late row, with

- ``_pinned_version``: the version it met no row at, and
- :data:`LATE_SINCE` (the ``_value`` column, which no stream tuple uses otherwise): when it
  first met no row, in microseconds since the epoch, carried with it from then on.

At each step (:func:`sort_late_rows`), a late row whose pinned version is older than the
step's master version **returns** (role :data:`RETURNING`): Algorithm 1 takes it as a new
tuple of the step (``run_step``'s ``returning``), so it probes H_R and spends a cycle in
H_S against the new version; a late row whose wait is over at the step's time is
**expired** (emitted unmatched by a left join, dropped by an inner one); every other late
row stays as it is. When a tuple that met no row leaves H_S again, it waits on (pinned to
the version it returned at) or, its wait over, expires (:func:`settle_unmatched`).

Invariants (for any sequence of steps; ``joins.ssbj.algorithm`` for the rest):

- a tuple is answered at most once: a late row is in the state or in a step's input,
  never in both, and a returning tuple is a pending tuple until it is answered, waits
  again or expires;
- a tuple waiting for a late row is answered from a master version it met no row at only
  if that version has its key (every answer comes from Algorithm 1 at the tuple's pinned
  version); it returns for every newer version seen at a step after it was settled;
- a tuple's wait is measured from the step that first found no row for it, to the step
  time the controller fixed before the step wrote anything (a rerun settles alike).

No Spark here: the module works on one bucket's Arrow rows (``joins.ssbj.buckets``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from joins.ssbj.algorithm import Row
from joins.ssbj.roles import LATE, LATE_SINCE, PINNED_VERSION, RETURNING, ROLE

# The readers' name of LATE_SINCE as a timestamp (``joins.ssbj.step.pending_tuples``).
WAITING_SINCE = "_late_since"


@dataclass(frozen=True)
class LateRule:
    """How a step treats the tuples no master row answered.

    ``wait_us`` 0 (``late_master`` dropped from the config while tuples waited) expires
    every waiting tuple at its next chance, so nothing is left behind."""

    at_us: int  # the step's time, fixed in its plan (microseconds since the epoch)
    wait_us: int  # how long a tuple may wait
    left_join: bool  # an expired tuple is emitted unmatched (left) or dropped (inner)
    master_version: int  # the step's master version

    def __post_init__(self) -> None:
        if self.wait_us < 0:
            raise ValueError(f"late wait: expected >= 0 microseconds, found {self.wait_us}")

    @property
    def waits(self) -> bool:
        """Whether tuples wait at all (a ``late_master`` is set; its wait is never 0)."""
        return self.wait_us > 0

    @property
    def expires_from(self) -> int:
        """A tuple waiting since at most this (epoch µs) has waited its wait."""
        return self.at_us - self.wait_us


@dataclass(frozen=True)
class SortedLateRows:
    """A bucket's table with its late rows sorted out (:func:`sort_late_rows`)."""

    table: pa.Table  # the input without late rows; returning ones relabelled RETURNING
    waiting: pa.Table  # late rows that stay as they are
    expired: pa.Table  # late rows whose wait is over


def sort_late_rows(table: pa.Table, rule: LateRule) -> SortedLateRows:
    """Split a bucket's late rows into returning, waiting and expired ones.

    A row returns when the step's master version is newer than the one it met no row at
    (even if its wait is over: the plain join probes a waiting tuple once more at a step
    with a newer version before it expires it)."""
    roles = table.column(ROLE)
    late = pc.equal(roles, LATE)
    if not pc.any(late).as_py():
        empty = table.schema.empty_table()
        return SortedLateRows(table, empty, empty)
    older = pc.less(table.column(PINNED_VERSION), rule.master_version)
    returning = pc.and_(late, pc.fill_null(older, False))
    over = pc.less_equal(table.column(LATE_SINCE), rule.expires_from)
    expired = pc.and_(pc.and_(late, pc.invert(returning)), pc.fill_null(over, True))
    waiting = pc.and_(pc.and_(late, pc.invert(returning)), pc.invert(expired))
    relabelled = pc.if_else(returning, pa.scalar(RETURNING, roles.type), roles)
    pinned = table.column(PINNED_VERSION)
    kept = table.set_column(table.schema.get_field_index(ROLE), ROLE, relabelled).set_column(
        table.schema.get_field_index(PINNED_VERSION),
        PINNED_VERSION,
        # A returning tuple is pinned anew when it enters H_S; its old pin means nothing.
        pc.if_else(returning, pa.scalar(None, pinned.type), pinned),
    )
    return SortedLateRows(
        kept.filter(pc.invert(pc.or_(waiting, expired))),
        table.filter(waiting),
        table.filter(expired),
    )


@dataclass(frozen=True)
class Settled:
    """Where the unmatched tuples of a step's output go (:func:`settle_unmatched`)."""

    emitted: list[int]  # output positions kept as unmatched rows
    waiting: list[int]  # output positions that become late rows
    since: list[int]  # for each waiting one, when it first met no row
    pinned: list[int]  # for each waiting one, the version it met no row at
    expired_waiters: int  # tuples that had waited before and expired now


def settle_unmatched(
    output: Sequence[tuple[Row, Row | None, int | None]],
    source: pa.Table,
    rule: LateRule,
) -> Settled:
    """For each unmatched tuple of a step's output (a left join's unmatched row, which
    Algorithm 1 emits for every tuple that met no row while late rows are kept), whether it
    waits on or expires. ``source`` is the bucket's input table the tuples point into (the
    last element of a decoded tuple is its position there): its ``_value`` says since when
    a tuple that waited before has waited, its ``_pinned_version`` which version a pending
    tuple met no row at (a tuple of this step met none at the step's version)."""
    positions = [i for i, (_, master, _) in enumerate(output) if master is None]
    rows = pa.array([output[i][0][-1] for i in positions], pa.int64())
    since_in = source.column(LATE_SINCE).take(rows).to_pylist()
    pinned_in = source.column(PINNED_VERSION).take(rows).to_pylist()
    emitted: list[int] = []
    waiting: list[int] = []
    waiting_since: list[int] = []
    waiting_pinned: list[int] = []
    expired_waiters = 0
    for i, since, pinned in zip(positions, since_in, pinned_in, strict=True):
        first = rule.at_us if since is None else int(since)
        if rule.waits and first > rule.expires_from:
            waiting.append(i)
            waiting_since.append(first)
            waiting_pinned.append(rule.master_version if pinned is None else int(pinned))
            continue
        expired_waiters += since is not None
        if rule.left_join:
            emitted.append(i)
    return Settled(emitted, waiting, waiting_since, waiting_pinned, expired_waiters)
