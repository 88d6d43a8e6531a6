"""Logging set-up of a command: the pipeline's own lines reach the console and task logs.

A command (``enrich``, ``make demo``) sets its packages' loggers to the level asked for.
Inside Airflow that is not enough: Airflow installs the root logger's only handler with
its own ``[logging] logging_level`` as the *handler's* level (``airflow/_shared/logging/
structlog.py``; in a worker's task process ``airflow/sdk/log.py``), so an INFO record that
passed our logger is dropped at the handler, and ``basicConfig`` does nothing because the
root already has a handler. So the root handlers are lowered to our level; the root
logger's own level stays, so loggers we did not set (Airflow's, libraries') keep filtering
as Airflow configured them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from common.secrets import install_secret_filter

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_command_logging(level: str, packages: Iterable[str]) -> None:
    """Send ``packages``' records at ``level`` and above to the root handlers, masked.

    ``level`` is a level name (``INFO``); an unknown name raises ValueError.
    """
    threshold = logging.getLevelName(level.upper())
    if not isinstance(threshold, int):
        raise ValueError(f"expected a log level name such as INFO, got {level!r}")
    logging.basicConfig(format=LOG_FORMAT)  # a no-op where Airflow (or pytest) configured it
    handlers = logging.getLogger().handlers
    install_secret_filter(handlers)  # URL passwords, ${VAR} secrets
    for name in packages:
        logging.getLogger(name).setLevel(threshold)
    for handler in handlers:
        if handler.level > threshold:
            handler.setLevel(threshold)
