"""Warehouse edge: Delta table access, landing-zone ingestion, and the pipeline state store.

All IO of the product happens in this package. Everything above it passes DataFrames.
"""

from __future__ import annotations
