"""The Airflow Assets of a pipeline's published tables: one naming, for the pipeline DAG
that updates them and for the DAGs scheduled on them (the quality report, consumers).

Two per table, group ``enrichment``:

- ``enrich://<pipeline>/gold/<table>``, named ``enrich_<pipeline>.<table>``: updated by
  every successful ``validate`` (or ``backfill``), whatever is still pending; the event's
  ``extra`` says whether the run's interval is complete and its share answered;
- ``enrich://<pipeline>/gold/<table>/complete``, named ``enrich_<pipeline>.<table>.complete``:
  updated only when an interval of the table became complete (nothing of it waits in the
  table's chain any more, ``pipeline.completeness``); the event's ``extra`` lists those
  intervals. A consumer that must see whole intervals schedules on this one.

Airflow is imported when called (by a DAG file, where it is loaded anyway).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GROUP = "enrichment"
COMPLETE = "complete"


def published_assets(pipeline: str, tables: Iterable[str]) -> list[Any]:
    """One ``airflow.sdk.Asset`` per published table of ``pipeline``."""
    from airflow.sdk import Asset

    return [
        Asset(
            name=f"enrich_{pipeline}.{table}", uri=f"enrich://{pipeline}/gold/{table}", group=GROUP
        )
        for table in tables
    ]


def complete_assets(pipeline: str, tables: Iterable[str]) -> list[Any]:
    """One ``airflow.sdk.Asset`` per published table of ``pipeline``, updated when an
    interval of the table became complete."""
    from airflow.sdk import Asset

    return [
        Asset(
            name=f"enrich_{pipeline}.{table}.{COMPLETE}",
            uri=f"enrich://{pipeline}/gold/{table}/{COMPLETE}",
            group=GROUP,
        )
        for table in tables
    ]
