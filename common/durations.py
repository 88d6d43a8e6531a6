"""Durations as the config writes them: ``30s``, ``5m``, ``1h``, ``1d``."""

from __future__ import annotations

import re
from datetime import timedelta

DURATION = re.compile(r"^(\d+)\s*(s|m|h|d)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """``text`` as a :class:`timedelta`; a ValueError says what was expected."""
    match = DURATION.match(text.strip())
    if not match:
        raise ValueError(f"expected a duration like 30s, 5m, 1h or 1d, got {text!r}")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
