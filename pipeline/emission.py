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

Each driver applies the rule of its join (``StageDriver.input_accounting``, and
``input_accounting_arrow`` for a batch validated in the driver's memory: the same rule over
Arrow tables); the audit knows no join kind.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from pipeline.stage_config import EquiStage, ThetaStage
from quality.audit_views import (
    input_accounting,
    input_accounting_arrow,
    union_accounting_arrow,
)
from warehouse.delta import DeltaEngine
from warehouse.delta.schema import spark_to_arrow


def theta_input_accounting(
    stage: ThetaStage, tuples: DataFrame, waiting: DataFrame | None, id_column: str
) -> DataFrame:
    """``audit_input`` rows of a theta stage: required for a left join, else accounted."""
    return _without_master(stage.join == "left", tuples, waiting, id_column)


def equi_input_accounting(
    stage: EquiStage,
    master: DataFrame,
    tuples: DataFrame,
    waiting: DataFrame | None,
    id_column: str,
) -> DataFrame:
    """``audit_input`` rows of an equi stage; ``master`` is the master's latest rows."""
    if stage.join == "left":
        return _without_master(True, tuples, waiting, id_column)
    columns = [id_column, *stage.join_on]
    flagged = input_accounting(tuples.select(*columns), id_column, False, master, stage.join_on)
    if waiting is None:
        return flagged
    return flagged.unionByName(
        input_accounting(waiting.select(*columns), id_column, must_emit_all=False)
    )


def _without_master(
    must_emit: bool, tuples: DataFrame, waiting: DataFrame | None, id_column: str
) -> DataFrame:
    ids = tuples.select(id_column)
    if waiting is not None:
        ids = ids.unionByName(waiting.select(id_column))
    return input_accounting(ids, id_column, must_emit_all=must_emit)


def theta_input_accounting_arrow(
    stage: ThetaStage, tuples: pa.Table, waiting: pa.Table | None, id_column: str
) -> pa.Table:
    """:func:`theta_input_accounting` over Arrow tables."""
    return _without_master_arrow(stage.join == "left", tuples, waiting, id_column)


def equi_input_accounting_arrow(
    stage: EquiStage,
    master_keys: pa.Table | None,
    tuples: pa.Table,
    waiting: pa.Table | None,
    id_column: str,
) -> pa.Table:
    """:func:`equi_input_accounting` over Arrow tables; ``master_keys`` holds the latest
    master's join key columns (:func:`master_keys_arrow`; an inner join needs them)."""
    if stage.join == "left":
        return _without_master_arrow(True, tuples, waiting, id_column)
    columns = [id_column, *stage.join_on]
    flagged = input_accounting_arrow(
        tuples.select(columns), id_column, False, master_keys, stage.join_on
    )
    if waiting is None:
        return flagged
    return union_accounting_arrow(
        flagged, input_accounting_arrow(waiting.select(columns), id_column, must_emit_all=False)
    )


def master_keys_arrow(
    stage: EquiStage, engine: DeltaEngine, master_path: str, tuples: pa.Table
) -> pa.Table | None:
    """The latest master's join key columns, for :func:`equi_input_accounting_arrow`; None
    for a left join, whose rule needs no master.

    Where the first key has the same kind on both sides (integers of any width, or one
    type), only the master rows whose first key one of ``tuples`` asks for are kept, each
    file filtered as it is read, and files whose log statistics put that key outside the
    asked range are not read: a large master costs the scan of its candidate files' key
    columns, not their memory. Keys of different kinds (an integer against a string, say)
    compare as the join's SQL coerces them, so every key is read and DuckDB compares."""
    if stage.join == "left":
        return None
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
    bounds = pc.min_max(asked)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    files = [f for f in snapshot.files if f.may_hold(first_master, low, high)]
    return engine.read_arrow(snapshot, files, keys, pc.field(first_master).isin(asked))


def _without_master_arrow(
    must_emit: bool, tuples: pa.Table, waiting: pa.Table | None, id_column: str
) -> pa.Table:
    ids = tuples.select([id_column])
    if waiting is not None:
        ids = pa.concat_tables([ids, waiting.select([id_column]).cast(ids.schema)])
    return input_accounting_arrow(ids, id_column, must_emit_all=must_emit)
