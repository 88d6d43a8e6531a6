"""Callables the generated DAGs run. Importing this module is cheap: no Spark, no GX.

Each task runs one ``enrich`` subcommand in the worker process with the DAG run's id and
data interval, and fails the task on any non-zero exit code but 4 (rejected landing files,
reported in the log; the rest of the run goes ahead). Exit codes 2 (bad configuration) and
3 (a quality gate failed) fail it without retries: rerunning cannot change the outcome, and
each retry would start a Spark session for nothing. Other failures (1, 5: a pipeline error,
a busy lease) are retried as the DAG's ``retries`` say.

Before the command runs, the Spark master and the state store come from Airflow connections
when neither the command line nor the environment names them
(:mod:`orchestration.connections`). A ``stage`` task takes the run's params: ``steps`` (SSBJ
operator steps this run, instead of ``operator.steps_per_run``) and ``drain`` (join every
pending tuple before the task ends).

After ``validate``, :func:`validate_and_describe` puts each published table's completeness
in the ``extra`` of its gold Asset event (the run's interval: complete or not, its share
answered and published), and :func:`announce_complete`, one task per table, updates the
table's ``complete`` Asset only when an interval of it became complete, and is skipped
otherwise (a skipped task emits no Asset event; ``orchestration.assets``).

:func:`route_run` sends a run of type ``backfill`` (``airflow backfill create``) to the
``backfill`` task, which re-joins the run's interval against the masters as of its end and
replaces it (``enrich backfill``); the live path (ingest, stages, validate) is skipped, so a
backfill never ingests today's files under a past interval nor moves live offsets.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from common.errors import EXIT_CONFIG, EXIT_PARTIAL, EXIT_VALIDATION, ConfigError
from common.secrets import register_secret
from orchestration.connections import (
    OBJECT_STORE_CONNECTION,
    SPARK_CONNECTION,
    STATE_STORE_CONNECTION,
    lookup,
    object_store_environment,
    spark_master_url,
    state_store_url,
)

# Where the state store's URL goes for the command (``pipeline.config.STATE_STORE_ENV``,
# which beats the config's ``warehouse.state_store``): an environment variable, so no
# credential appears in a command line. Spelled out here: parsing a DAG imports no config.
STATE_STORE_ENV = "ENRICH_STATE_STORE"
# Exit codes no retry can change.
FINAL_EXIT_CODES = (EXIT_CONFIG, EXIT_VALIDATION)
SPARK_MASTER_ENV = "SPARK_MASTER"
# The run type of `airflow backfill create` runs (DagRunType.BACKFILL_JOB).
BACKFILL_RUN_TYPE = "backfill"
LIVE_TASK = "ingest"
BACKFILL_TASK = "backfill"

if TYPE_CHECKING:
    from pipeline.config import PipelineConfig
    from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)


class EnrichTaskError(RuntimeError):
    """An ``enrich`` subcommand run by an Airflow task exited non-zero."""


def route_run(dag_run: Any = None) -> str:
    """The first task of a run: ``backfill`` for backfill runs, else ``ingest``."""
    kind = getattr(dag_run, "run_type", None)
    run_type = str(getattr(kind, "value", kind) or "")  # DagRunType, or its string
    chosen = BACKFILL_TASK if run_type == BACKFILL_RUN_TYPE else LIVE_TASK
    logger.info("run %s of type %s: %s", getattr(dag_run, "run_id", "?"), run_type, chosen)
    return chosen


def run_options(
    argv: Sequence[str],
    run_id: str | None,
    start: datetime | None,
    end: datetime | None,
) -> list[str]:
    """``--run-id``, ``--start`` and ``--end`` from the run, for those ``argv`` lacks."""
    options: list[str] = []
    if run_id and "--run-id" not in argv:
        options += ["--run-id", run_id]
    if start is not None and end is not None and "--start" not in argv:
        options += ["--start", start.isoformat(), "--end", end.isoformat()]
    return options


def stage_options(params: Mapping[str, Any] | None) -> list[str]:
    """``enrich stage`` options from the run's params (``steps``, ``drain``)."""
    if not params:
        return []
    options: list[str] = []
    steps = params.get("steps")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise EnrichTaskError(f"param steps: expected a whole number >= 1, found {steps!r}")
        options += ["--steps", str(steps)]
    drain = params.get("drain", False)
    if not isinstance(drain, bool):
        raise EnrichTaskError(f"param drain: expected true or false, found {drain!r}")
    if drain:
        options.append("--drain")
    return options


def connection_settings(argv: list[str]) -> list[str]:
    """Global ``enrich`` options from Airflow connections: ``--master`` unless the command
    line or ``SPARK_MASTER`` has one. The state store's URL from its connection is put in
    ``ENRICH_STATE_STORE`` unless that is set."""
    options: list[str] = []
    if "--master" not in argv and not os.environ.get(SPARK_MASTER_ENV):
        spark = lookup(SPARK_CONNECTION)
        if spark is not None:
            master = spark_master_url(spark)
            logger.info("Spark master %s from Airflow connection %s", master, SPARK_CONNECTION)
            options += ["--master", master]
    use_state_store_connection()
    use_object_store_connection()
    return options


def use_object_store_connection() -> None:
    """Put the object store's endpoint, region and keys from its Airflow connection in the
    ``AWS_*`` variables, unless the process has its own keys or endpoint."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_ENDPOINT_URL"):
        return
    store = lookup(OBJECT_STORE_CONNECTION)
    if store is not None:
        environment = object_store_environment(store)
        if "AWS_SECRET_ACCESS_KEY" in environment:
            register_secret(environment["AWS_SECRET_ACCESS_KEY"])  # masked in task logs
        os.environ.update(environment)
        logger.info("object store from Airflow connection %s", OBJECT_STORE_CONNECTION)


def use_state_store_connection() -> None:
    """Put the state store's URL from its Airflow connection in ``ENRICH_STATE_STORE``,
    unless that is set."""
    if not os.environ.get(STATE_STORE_ENV):
        store = lookup(STATE_STORE_CONNECTION)
        if store is not None:
            os.environ[STATE_STORE_ENV] = state_store_url(store)
            logger.info("state store from Airflow connection %s", STATE_STORE_CONNECTION)


def report_range(
    dag_run: Any = None, triggering_asset_events: Mapping[Any, Any] | None = None
) -> tuple[datetime, datetime]:
    """The data intervals the quality report of an asset-triggered run covers: from the
    earliest start to the latest end of the pipeline runs whose events triggered it and of
    the intervals those events announce complete (an earlier run's interval, completed
    later), or else (a manual run) the day before the run."""
    events = [event for found in (triggering_asset_events or {}).values() for event in found]
    intervals = [
        (run.data_interval_start, run.data_interval_end)
        for event in events
        for run in [getattr(event, "source_dag_run", None)]
        if run is not None and run.data_interval_start and run.data_interval_end
    ]
    intervals += [
        (datetime.fromisoformat(i["interval_start"]), datetime.fromisoformat(i["interval_end"]))
        for event in events
        for i in (getattr(event, "extra", None) or {}).get("intervals", [])
        if i.get("interval_start") and i.get("interval_end")
    ]
    if intervals:
        return min(start for start, _ in intervals), max(end for _, end in intervals)
    after = getattr(dag_run, "run_after", None) or datetime.now(UTC)
    return after - timedelta(days=1), after


def run_report(
    config: str,
    dag_run: Any = None,
    triggering_asset_events: Mapping[Any, Any] | None = None,
) -> None:
    """``enrich report --fail-on-unresolved`` over :func:`report_range`."""
    start, end = report_range(dag_run, triggering_asset_events)
    logger.info("quality report of the runs in [%s, %s)", start.isoformat(), end.isoformat())
    run_enrich(
        config,
        "report",
        *("--start", start.isoformat(), "--end", end.isoformat()),
        "--fail-on-unresolved",
    )


def run_enrich(
    config: str,
    *argv: str,
    params: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    data_interval_start: datetime | None = None,
    data_interval_end: datetime | None = None,
    worker: bool = False,
) -> None:
    """``enrich --config CONFIG ARGV...`` plus the run's identity from Airflow's context:
    ``--run-id`` and, when the run has a data interval, ``--start``/``--end`` (a run
    triggered without a logical date has none), unless ``argv`` gives them. With
    ``worker``, the command runs in the pipeline's warm worker (``enrich --worker``)."""
    from jobs.enrich import main  # Spark and the pipeline load only when run

    command = [*argv, *run_options(argv, run_id, data_interval_start, data_interval_end)]
    try:
        if command and command[0] == "stage":
            command += stage_options(params)
        global_options = connection_settings(command)
    except ConfigError as e:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"enrich {' '.join(argv)}: {e}") from e
    logger.info("enrich %s%s", "--worker " if worker else "", " ".join([*global_options, *command]))
    code = main(["--config", config, *global_options, *(["--worker"] if worker else []), *command])
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


def validate_and_describe(
    config: str,
    *argv: str,
    outlet_events: Any = None,
    params: Mapping[str, Any] | None = None,
    run_id: str | None = None,
    data_interval_start: datetime | None = None,
    data_interval_end: datetime | None = None,
    worker: bool = False,
) -> None:
    """``enrich validate`` (:func:`run_enrich`), then the ``extra`` of each published
    table's Asset event: the run's interval, whether it is complete, its share answered
    and published, and the intervals this run completed
    (:func:`pipeline.completeness.published_extra`)."""
    run_enrich(
        config,
        "validate",
        *argv,
        params=params,
        run_id=run_id,
        data_interval_start=data_interval_start,
        data_interval_end=data_interval_end,
        worker=worker,
    )
    if outlet_events is None or run_id is None:
        return
    from orchestration.assets import published_assets
    from pipeline.completeness import published_extra

    window = None
    if data_interval_start is not None and data_interval_end is not None:
        window = (data_interval_start, data_interval_end)
    with pipeline_store(config) as (pipeline, store):
        outputs = pipeline.outputs()
        for table, asset in zip(outputs, published_assets(pipeline.name, outputs), strict=True):
            extra = published_extra(pipeline, store, table, run_id, window)
            outlet_events[asset].extra = extra
            logger.info(
                "%s: interval %s..%s %s, %.1f%% answered and published",
                table,
                extra["interval_start"],
                extra["interval_end"],
                "complete" if extra["complete"] else "not complete",
                100 * extra["share_answered"],
            )


def announce_complete(
    config: str, table: str, outlet_events: Any = None, run_id: str | None = None
) -> None:
    """Update ``table``'s ``complete`` Asset with the intervals run ``run_id`` completed
    (:func:`pipeline.completeness.completed_extra`); skip the task, so that no event is
    emitted, when it completed none."""
    from airflow.sdk.exceptions import AirflowSkipException

    from orchestration.assets import complete_assets
    from pipeline.completeness import completed_extra

    if run_id is None:
        raise AirflowSkipException(f"{table}: a run without an id completes no interval")
    with pipeline_store(config) as (pipeline, store):
        extra = completed_extra(store, table, run_id)
        name = pipeline.name
    if extra is None:
        raise AirflowSkipException(f"no interval of {table} became complete in run {run_id}")
    (asset,) = complete_assets(name, [table])
    if outlet_events is not None:
        outlet_events[asset].extra = extra
    logger.info(
        "%s: run %s completed interval(s) %s",
        table,
        run_id,
        ", ".join(str(i["interval_start"]) for i in extra["intervals"]),
    )


@contextmanager
def pipeline_store(config: str) -> Iterator[tuple[PipelineConfig, StateStore]]:
    """The pipeline's config and its state store (from the Airflow connection when the
    environment names none), closed afterwards. No Spark."""
    from pathlib import Path

    from pipeline.config import load_config
    from warehouse.state_store import StateStore

    try:
        loaded = load_config(Path(config))
    except ConfigError as e:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"{config}: {e}") from e
    use_state_store_connection()
    store = StateStore(loaded.warehouse.resolved_state_store())
    try:
        yield loaded, store
    finally:
        store.dispose()
