"""The theta predicate of a theta stage, as the config declares it (no Spark import, so
the config can be validated cheaply); ``joins.theta.condition`` turns it into a Spark condition."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from common.model import Identifier, Strict


class ThetaPredicate(Strict):
    """A monotonic theta predicate between a stream column and master column(s).

    band:  |s.stream_column - r.master_column| <= eps (or lower/upper for asymmetric bands)
    range: r.lo <= s.stream_column < r.hi
    less/less_equal/greater/greater_equal: s.stream_column <op> r.master_column
    """

    type: Literal["band", "range", "less", "less_equal", "greater", "greater_equal"]
    stream_column: Identifier
    master_column: Identifier | None = None
    lo: Identifier | None = None
    hi: Identifier | None = None
    eps: float | None = Field(default=None, ge=0)
    lower: float | None = Field(default=None, ge=0)
    upper: float | None = Field(default=None, ge=0)
    residual: str | None = None

    def band_bounds(self) -> tuple[float, float]:
        """(lower, upper) of a band ``s - lower <= r <= s + upper``; eps fills unset sides."""
        lower = self.eps if self.lower is None else self.lower
        upper = self.eps if self.upper is None else self.upper
        return lower or 0.0, upper or 0.0

    @model_validator(mode="after")
    def _fields_for_type(self) -> ThetaPredicate:
        if self.type == "range":
            if not (self.lo and self.hi):
                raise ValueError("a range predicate needs 'lo' and 'hi' master columns")
        elif not self.master_column:
            raise ValueError(f"a {self.type} predicate needs 'master_column'")
        if self.type == "band" and self.eps is None and (self.lower is None or self.upper is None):
            raise ValueError("a band predicate needs 'eps' or both 'lower' and 'upper'")
        return self
