"""Named crash points for fault-injection tests.

Code that commits in several steps calls :func:`crash_point` between them. In production the
call is a dictionary lookup and nothing else. A test sets ``ENRICH_CRASH_AT=<name>`` (or
``<name>:<n>`` for the n-th time the point is reached) in a child process, and the process
kills itself with SIGKILL there: no ``finally`` blocks, no atexit hooks, exactly like an
out-of-memory kill or a lost node.
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

CRASH_ENV_VAR = "ENRICH_CRASH_AT"

_hits: dict[str, int] = {}


def reset_crash_counts() -> None:
    """Forget how often each point was reached (a long-lived process arming a new crash)."""
    _hits.clear()


def crash_point(name: str) -> None:
    """Kill this process with SIGKILL if ``ENRICH_CRASH_AT`` names this point."""
    wanted = os.environ.get(CRASH_ENV_VAR)
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(nth or "1"):
        logger.warning("fault injection: killing process at crash point %s", name)
        os.kill(os.getpid(), signal.SIGKILL)
