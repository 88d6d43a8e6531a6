"""The pipeline library: configuration, table layout, the stage drivers and the runner that
runs them, write-audit-publish, status and maintenance."""

from __future__ import annotations
