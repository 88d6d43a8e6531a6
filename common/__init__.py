"""Pieces shared by every layer: the domain error hierarchy and fault injection points."""

from __future__ import annotations
