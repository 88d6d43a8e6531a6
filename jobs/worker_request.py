"""A command line sent to the warm worker (``enrich [OPTIONS] --worker COMMAND ...``), read
without the CLI's parser.

Every task of a scheduled run is such a client (the DAG's default): it only forwards its
command to the worker, which parses it fully and reports any error back. Reading the
global options by hand spares each task the parser's imports and its construction (about
70 ms of a client's 150 ms, measured with ``python -X importtime``; ``process start`` in
``benchmarks/interval_cost.py``). Anything this reader does not know (``--help``,
``--version``, an unknown option, a command that never runs in the worker) is left to the
full parser (:func:`worker_request` returns None).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONFIG = "configs/demo.yaml"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# The commands a client may send to the worker: every one but those that run on their
# own (``worker``, ``spark-server``, ``stream``); tests/jobs/test_worker_request.py holds
# it to the parser's.
WORKER_COMMANDS = frozenset(
    {
        "ingest",
        "stage",
        "run",
        "validate",
        "drain",
        "backfill",
        "status",
        "plan",
        "report",
        "resolve",
        "demo-data",
        "generate-dag",
        "maintain",
    }
)
_VALUED = ("--config", "--log-level", "--master", "--wait")


@dataclass(frozen=True)
class WorkerRequest:
    """What a client needs to reach its worker, and the command line the worker runs."""

    config: Path
    master: str | None
    log_level: str
    argv: list[str]  # without --worker


def worker_request(argv: Sequence[str]) -> WorkerRequest | None:
    """``argv`` as a worker request when its global options (before the command) are
    only ``--config``, ``--log-level``, ``--master``, ``--wait`` and ``--worker``, the last
    given, and its command is one the worker runs; else None (the full parser decides)."""
    values: dict[str, str] = {}
    forwarded: list[str] = []
    via_worker = False
    index = 0
    while index < len(argv):
        token = argv[index]
        if not token.startswith("-"):
            break
        if token == "--worker":
            via_worker = True
            index += 1
            continue
        name, equals, value = token.partition("=")
        if name not in _VALUED:
            return None
        if not equals:
            if index + 1 >= len(argv):
                return None
            value = argv[index + 1]
            forwarded += [name, value]
            index += 2
        else:
            forwarded.append(token)
            index += 1
        values[name] = value
    if not via_worker or index >= len(argv) or argv[index] not in WORKER_COMMANDS:
        return None
    level = values.get("--log-level", "INFO").upper()
    if level not in LOG_LEVELS:
        return None
    return WorkerRequest(
        config=Path(values.get("--config", DEFAULT_CONFIG)),
        master=values.get("--master"),
        log_level=level,
        argv=[*forwarded, *argv[index:]],
    )
