"""A self-contained Airflow home for embedded runs: SQLite metadata DB, this repo's DAGs.

Call :func:`prepare_airflow_home` before the first ``import airflow``: Airflow reads its
configuration from the environment when it is imported.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
# The pool the generated DAGs' Spark tasks take (the config's schedule.pool default); one
# slot: one Spark driver at a time on this machine.
DEFAULT_POOL = "enrich_spark"


def prepare_airflow_home(home: Path, dags_folder: Path = REPO_ROOT / "dags") -> dict[str, str]:
    """Point Airflow at ``home`` and create its metadata DB on first use."""
    home.mkdir(parents=True, exist_ok=True)
    settings = {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }
    os.environ.update(settings)
    if not (home / "airflow.db").exists():
        logger.info("creating Airflow metadata DB in %s", home)
        airflow = Path(sys.executable).with_name("airflow")
        for command in (
            ["db", "migrate"],
            ["pools", "set", DEFAULT_POOL, "1", "concurrent Spark drivers of the pipeline"],
        ):
            subprocess.run(
                [str(airflow), *command], check=True, capture_output=True, env=os.environ.copy()
            )
    return settings
