"""The audit views a suite's SQL expectations read beside the staged batch.

A staged batch alone cannot show a tuple that vanished: it is simply not there. So the
audit also registers two views, built here as pure transforms:

``audit_input``    one row per stream tuple that entered the stage since the last audit:
                   ``tuple_id`` and ``must_emit`` (false only where an inner join may
                   legitimately emit nothing for it);
                   Tuples that were still pending at the last audit are included again,
                   since they must be accounted for now;
``audit_pending``  one row per tuple still waiting in the operator's state: ``tuple_id``,
                   ``age_steps`` (steps since it entered) and ``max_age_steps`` (the
                   stage's maximum delay: one R-cycle of k steps for SSBJ);
``audit_published`` ids of already-published rows of the tuples that were pending at the
                   last audit (a left-join tuple matched in an earlier step and expired
                   now has nothing left to emit).

Row conservation is then a query: every ``audit_input`` tuple with ``must_emit`` is in the
batch, in ``audit_pending`` or in ``audit_published``. Freshness: no ``audit_pending`` row
has ``age_steps > max_age_steps``. See ``expectations/*.json`` for the suites using them.

Each view is written once, over :class:`common.rows.Rows`: the same transform builds it
as an Arrow table in the driver (a batch validated in memory, ``quality.batch_engine``:
no Spark job, where collecting each Spark frame cost 0.05-0.35 s, nine per demo interval)
or as a Spark frame (a batch validated on Spark, a backfill).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import narwhals.stable.v2 as nw

from common.rows import Frame, Rows
from joins.columns import INTERVAL_START

INPUT_VIEW = "audit_input"
PENDING_VIEW = "audit_pending"
PUBLISHED_VIEW = "audit_published"
TUPLE_ID = "tuple_id"
MUST_EMIT = "must_emit"
AGE_STEPS = "age_steps"
MAX_AGE_STEPS = "max_age_steps"

_MATCHED = "_audit_has_match"
_OLDEST = "_audit_oldest"


def input_accounting(
    new_input: Rows,
    id_column: str,
    must_emit_all: bool,
    master_keys: Rows | None = None,
    join_on: Mapping[str, str] | None = None,
) -> Rows:
    """``audit_input`` rows for ``new_input``: one per tuple id.

    ``must_emit_all`` holds for left joins. For an inner equi join pass the master's key
    columns (named as in the master) and the stream-to-master column mapping: a tuple must
    be emitted exactly when its key exists in the master (keys compared as
    :func:`comparable_keys` makes them). Otherwise (inner theta) no tuple is required.
    """
    keyed = master_keys is not None and bool(join_on) and not must_emit_all
    return Rows.apply(
        _input_accounting,
        new_input,
        master_keys if keyed else None,
        id_column=id_column,
        must_emit_all=must_emit_all,
        join_on=dict(join_on or {}),
    )


def _input_accounting(
    tuples: Frame,
    master_keys: Frame | None,
    id_column: str,
    must_emit_all: bool,
    join_on: dict[str, str],
) -> Frame:
    if master_keys is None:
        flagged = tuples.select(
            nw.col(id_column).alias(TUPLE_ID), nw.lit(must_emit_all).alias(MUST_EMIT)
        )
    else:
        stream_keys, master_keys = comparable_keys(tuples, master_keys, join_on)
        keys = (
            master_keys.select(*join_on.values())
            .unique()
            .with_columns(nw.lit(True).alias(_MATCHED))
        )
        flagged = stream_keys.join(
            keys, left_on=list(join_on), right_on=list(join_on.values()), how="left"
        ).select(
            nw.col(id_column).alias(TUPLE_ID),
            nw.col(_MATCHED).fill_null(False).alias(MUST_EMIT),
        )
    return flagged.group_by(TUPLE_ID).agg(nw.col(MUST_EMIT).max())


def comparable_keys(
    stream: Frame, master: Frame, join_on: Mapping[str, str]
) -> tuple[Frame, Frame]:
    """``stream`` and ``master`` with each join key pair cast to one type, as SQL compares
    them: integers of two widths as 64-bit, numbers of two kinds as doubles, a string
    against another type as that type; any other pair as the master's type. A pair of one
    type is left as it is."""
    stream_types, master_types = stream.collect_schema(), master.collect_schema()
    to_stream: list[Any] = []
    to_master: list[Any] = []
    for s, m in join_on.items():
        left, right = stream_types[s], master_types[m]
        if left == right:
            continue
        if left.is_integer() and right.is_integer():
            left = right = nw.Int64()
        elif left.is_numeric() and right.is_numeric():
            left = right = nw.Float64()
        elif left == nw.String():
            left = right
        elif right == nw.String():
            right = left
        else:
            left = right
        if left != stream_types[s]:
            to_stream.append(nw.col(s).cast(left))
        if right != master_types[m]:
            to_master.append(nw.col(m).cast(right))
    return (
        stream.with_columns(*to_stream) if to_stream else stream,
        master.with_columns(*to_master) if to_master else master,
    )


def union_accounting(first: Rows, second: Rows) -> Rows:
    """Two ``audit_input`` views as one (a tuple in both keeps both rows)."""
    return Rows.apply(_union, first, second)


def _union(first: Frame, second: Frame) -> Frame:
    schema = first.collect_schema()
    return nw.concat([first, second.select(*(nw.col(n).cast(t) for n, t in schema.items()))])


def pending_ages(
    pending: Rows, id_column: str, entry_step_column: str, next_step: int, max_age_steps: int
) -> Rows:
    """``audit_pending`` rows: how many steps each waiting tuple has waited."""
    return Rows.apply(
        _pending_ages,
        pending,
        id_column=id_column,
        entry_step_column=entry_step_column,
        next_step=next_step,
        max_age_steps=max_age_steps,
    )


def _pending_ages(
    pending: Frame, id_column: str, entry_step_column: str, next_step: int, max_age_steps: int
) -> Frame:
    return pending.select(
        nw.col(id_column).alias(TUPLE_ID),
        (nw.lit(next_step, nw.Int64()) - nw.col(entry_step_column).cast(nw.Int64()))
        .cast(nw.Int64())
        .alias(AGE_STEPS),
        nw.lit(max_age_steps, nw.Int64()).alias(MAX_AGE_STEPS),
    )


def no_pending(tuples: Rows, id_column: str) -> Rows:
    """An empty ``audit_pending`` view whose ``tuple_id`` has the type of ``tuples``' ids."""
    return Rows.apply(_no_pending, tuples, id_column=id_column)


def _no_pending(tuples: Frame, id_column: str) -> Frame:
    return _pending_ages(
        tuples.select(nw.col(id_column), nw.lit(0).alias("_entry")), id_column, "_entry", 0, 0
    ).head(0)


def no_published(tuples: Rows, id_column: str) -> Rows:
    """An empty ``audit_published`` view whose ``tuple_id`` has the type of ``tuples``' ids."""
    return Rows.apply(_no_published, tuples, id_column=id_column)


def _no_published(tuples: Frame, id_column: str) -> Frame:
    return tuples.select(nw.col(id_column).alias(TUPLE_ID)).head(0)


def published_tuples(published: Rows, waiting: Rows, id_column: str) -> Rows:
    """``audit_published``: the distinct ids in ``published`` of the ``waiting`` tuples.

    Where both carry ``_interval_start``, only published rows of the oldest waiting
    tuple's interval or later count (a tuple is published in its own interval), so a
    reader may skip older partitions.
    """
    return Rows.apply(_published_tuples, published, waiting, id_column=id_column)


def _published_tuples(published: Frame, waiting: Frame, id_column: str) -> Frame:
    if INTERVAL_START in waiting.collect_schema() and INTERVAL_START in published.collect_schema():
        oldest = waiting.select(nw.col(INTERVAL_START).min().alias(_OLDEST))
        published = published.join(oldest, how="cross").filter(
            nw.col(INTERVAL_START) >= nw.col(_OLDEST)
        )
    ids = waiting.select(nw.col(id_column).alias(TUPLE_ID)).unique()
    return (
        published.select(nw.col(id_column).alias(TUPLE_ID))
        .join(ids, on=TUPLE_ID, how="semi")
        .unique()
    )
