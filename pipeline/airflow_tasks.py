"""Callables the generated DAGs run. Importing this module is cheap: no Spark, no GX.

Each task runs one ``enrich`` subcommand in the worker process with the DAG run's id and
data interval, and fails the task on any non-zero exit code.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class EnrichTaskError(RuntimeError):
    """An ``enrich`` subcommand run by an Airflow task exited non-zero."""


def run_enrich(config: str, *argv: str) -> None:
    from jobs.enrich import main  # Spark and the pipeline load only when the task runs

    code = main(["--config", config, *argv])
    if code != 0:
        raise EnrichTaskError(
            f"enrich {' '.join(argv)} exited with code {code}; see the task log above"
        )
