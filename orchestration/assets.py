"""The Airflow Assets of a pipeline's published tables: one naming, for the pipeline DAG
that updates them and for the DAGs scheduled on them (the quality report, consumers).

``enrich://<pipeline>/gold/<table>``, named ``enrich_<pipeline>.<table>``, group
``enrichment``. Airflow is imported when called (by a DAG file, where it is loaded anyway).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

GROUP = "enrichment"


def published_assets(pipeline: str, tables: Iterable[str]) -> list[Any]:
    """One ``airflow.sdk.Asset`` per published table of ``pipeline``."""
    from airflow.sdk import Asset

    return [
        Asset(
            name=f"enrich_{pipeline}.{table}", uri=f"enrich://{pipeline}/gold/{table}", group=GROUP
        )
        for table in tables
    ]
