"""Base types of every validated config model: strict, frozen, with checked identifiers.

Shared by the pipeline config and the models the lower layers own (a theta predicate, a
quality gate), so that those layers need not import the pipeline.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
Identifier = Annotated[str, Field(pattern=NAME)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
