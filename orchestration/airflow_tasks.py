"""Callables the generated DAGs run. Importing this module is cheap: no Spark, no GX.

Each task runs one ``enrich`` subcommand in the worker process with the DAG run's id and
data interval, and fails the task on any non-zero exit code but 4 (rejected landing files,
reported in the log; the rest of the run goes ahead). Exit codes 2 (bad configuration) and
3 (a quality gate failed) fail it without retries: rerunning cannot change the outcome, and
each retry would start a Spark session for nothing. Other failures (1, 5: a pipeline error,
a busy lease) are retried as the DAG's ``retries`` say.
"""

from __future__ import annotations

import logging

from common.errors import EXIT_CONFIG, EXIT_PARTIAL, EXIT_VALIDATION

# Exit codes no retry can change.
FINAL_EXIT_CODES = (EXIT_CONFIG, EXIT_VALIDATION)

logger = logging.getLogger(__name__)


class EnrichTaskError(RuntimeError):
    """An ``enrich`` subcommand run by an Airflow task exited non-zero."""


def run_enrich(config: str, *argv: str) -> None:
    from jobs.enrich import main  # Spark and the pipeline load only when run

    code = main(["--config", config, *argv])
    if code == EXIT_PARTIAL:
        # Rejected landing files stay in place and are reported on every run until someone
        # moves them; the other files were loaded, so the run's stages go ahead.
        logger.error(
            "enrich %s: done, but landing files were rejected (listed above and in "
            "`enrich status`); the other files were loaded",
            " ".join(argv),
        )
        return
    if code in FINAL_EXIT_CODES:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(
            f"enrich {' '.join(argv)} exited with code {code} "
            f"({'bad configuration' if code == EXIT_CONFIG else 'a quality gate failed'}); "
            "not retried, since a rerun gives the same answer; see the task log above"
        )
    if code != 0:
        raise EnrichTaskError(
            f"enrich {' '.join(argv)} exited with code {code}; see the task log above"
        )
