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

Each driver applies the rule of its join (``StageDriver.input_accounting``); the audit
knows no join kind.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from pipeline.config import EquiStage, ThetaStage
from quality.audit_views import input_accounting


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
