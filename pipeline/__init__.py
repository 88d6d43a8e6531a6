"""Pipeline orchestration: configuration, table layout, stage drivers, runs, publish."""

from __future__ import annotations
