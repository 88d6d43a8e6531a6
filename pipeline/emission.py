"""Which input tuples a stage's join must emit rows for: the ``audit_input`` view.

The audit checks row conservation (every tuple that entered a stage is emitted, published
earlier, or pending) and needs, per tuple, whether rows are *required*:

- a left join emits every tuple (its matches, or once with nulls);
- an inner equi join emits a tuple exactly when its key exists in the master;
- an inner theta join requires nothing (whether a band or range matches is the join's
  business, checked against the oracle in the tests, not by the audit).

A tuple that was pending at the last audit of an inner equi join is accounted, not
required: whether it has rows depends on the master version it is pinned to, which may
differ from the latest one read here (a key added since would demand rows it never had).

Each driver applies the rule of its join (``StageDriver.input_accounting``), over
:class:`common.rows.Rows`: one rule, built in the driver's memory for a small batch or on
Spark; the audit knows no join kind.
"""

from __future__ import annotations

import narwhals.stable.v2 as nw
import pyarrow as pa
import pyarrow.compute as pc

from common.rows import Frame, Rows
from joins.asked_keys import AskedValues
from pipeline.stage_config import EquiStage, ThetaStage
from quality.audit_views import input_accounting, union_accounting
from warehouse.delta import DeltaEngine
from warehouse.delta.schema import spark_to_arrow


def theta_input_accounting(
    stage: ThetaStage, tuples: Rows, waiting: Rows | None, id_column: str
) -> Rows:
    """``audit_input`` rows of a theta stage: required for a left join, else accounted."""
    return _without_master(stage.join == "left", tuples, waiting, id_column)


def equi_input_accounting(
    stage: EquiStage,
    master_keys: Rows | None,
    tuples: Rows,
    waiting: Rows | None,
    id_column: str,
) -> Rows:
    """``audit_input`` rows of an equi stage; ``master_keys`` holds the latest master's
    join key columns (:func:`master_keys`; an inner join needs them)."""
    if stage.join == "left" or master_keys is None:
        return _without_master(stage.join == "left", tuples, waiting, id_column)
    flagged = input_accounting(tuples, id_column, False, master_keys, stage.join_on)
    if waiting is None:
        return flagged
    return union_accounting(flagged, input_accounting(waiting, id_column, must_emit_all=False))


def master_keys(
    stage: EquiStage, engine: DeltaEngine, master_path: str, tuples: Rows
) -> Rows | None:
    """The latest master's join key columns, for :func:`equi_input_accounting`; None for a
    left join, whose rule needs no master.

    Read on Spark, every key. Read into the driver, where the first key has the same kind
    on both sides (integers of any width, or one type), only the master rows whose first
    key one of ``tuples`` asks for are kept, each file filtered as it is read, and files
    whose log statistics put that key outside the asked range are not read: a large master
    costs the scan of its candidate files' key columns, not their memory. Keys of
    different kinds are all read (they compare as ``quality.audit_views.comparable_keys``
    casts them)."""
    if stage.join == "left":
        return None
    keys = list(stage.join_on.values())
    return Rows.read(
        arrow=lambda: _asked_master_keys(stage, engine, master_path, tuples.to_arrow()),
        spark=lambda: engine.read(master_path).select(*keys),
    )


def _asked_master_keys(
    stage: EquiStage, engine: DeltaEngine, master_path: str, tuples: pa.Table
) -> pa.Table:
    snapshot = engine.snapshot(master_path)
    keys = list(stage.join_on.values())
    first_stream, first_master = next(iter(stage.join_on.items()))
    master_type = spark_to_arrow(snapshot.schema).field(first_master).type
    stream_type = tuples.schema.field(first_stream).type
    same_kind = stream_type == master_type or (
        pa.types.is_integer(stream_type) and pa.types.is_integer(master_type)
    )
    if not same_kind:
        return engine.read_arrow(snapshot, columns=keys)
    try:
        asked = pc.unique(tuples.column(first_stream).cast(master_type)).drop_null()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # out of the master's range
        return engine.read_arrow(snapshot, columns=keys)
    if len(asked) == 0:
        return engine.read_arrow(snapshot, [], columns=keys)
    wanted = AskedValues.of(first_master, asked)
    bounds = wanted.bounds()
    files = [f for f in snapshot.files if bounds is None or f.may_hold(first_master, *bounds)]
    return engine.read_arrow(snapshot, files, keys, wanted.members)


def _without_master(must_emit: bool, tuples: Rows, waiting: Rows | None, id_column: str) -> Rows:
    ids = Rows.apply(_ids, tuples, waiting, id_column=id_column)
    return input_accounting(ids, id_column, must_emit_all=must_emit)


def _ids(tuples: Frame, waiting: Frame | None, id_column: str) -> Frame:
    ids = tuples.select(id_column)
    if waiting is None:
        return ids
    id_type = ids.collect_schema()[id_column]
    return nw.concat([ids, waiting.select(nw.col(id_column).cast(id_type))])
