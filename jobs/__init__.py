"""spark-submit entry points: parse arguments, build the session, call the library, exit."""

from __future__ import annotations
