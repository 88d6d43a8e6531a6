"""Theta predicates as Spark column expressions (the residual filter included)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from joins.theta.predicate import ThetaPredicate


def theta_condition(predicate: ThetaPredicate, stream: DataFrame, master: DataFrame) -> Column:
    """The join condition ``predicate`` describes, over the two DataFrames' columns."""
    s = stream[predicate.stream_column]
    if predicate.type == "range":
        assert predicate.lo and predicate.hi
        condition = (master[predicate.lo] <= s) & (s < master[predicate.hi])
    else:
        assert predicate.master_column
        r = master[predicate.master_column]
        if predicate.type == "band":
            lower, upper = predicate.band_bounds()
            condition = (r >= s - F.lit(lower)) & (r <= s + F.lit(upper))
        else:
            condition = {
                "less": s < r,
                "less_equal": s <= r,
                "greater": s > r,
                "greater_equal": s >= r,
            }[predicate.type]
    if predicate.residual:
        condition = condition & F.expr(predicate.residual)
    return condition
