"""Pipeline orchestration: configuration, table layout, stage runner, demo data."""

from __future__ import annotations
