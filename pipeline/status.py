"""``enrich status``: offsets, lag, landing files, the last runs and each output's recent
intervals (complete or waiting), without starting Spark.

Everything it shows is in the state store or in Delta logs, so it reads the logs with
delta-rs (any Delta table, whichever engine wrote it) and never builds a Spark session:
the answer comes in about a second, even while Spark is busy elsewhere.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pyarrow.compute as pc
from deltalake import DeltaTable

from pipeline.completeness import completeness_status
from pipeline.config import PipelineConfig
from pipeline.late_table import LATE_SINCE, late_table
from pipeline.layout import WarehouseLayout
from warehouse.landing_location import rejected_in_place, zone_for
from warehouse.object_store import storage_options
from warehouse.state_store import StateStore
from warehouse.state_tables import DUPLICATE, LOADED, MISSING, REGISTERED, REJECTED


def table_version(path: str) -> int | None:
    """The latest version of the Delta table at ``path``, or None if there is none."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options(path)):
        return None
    return DeltaTable(path, storage_options=storage_options(path)).version()


def late_tuples(path: str) -> dict[str, Any]:
    """Tuples waiting for late master rows (``operator.late_master``): how many, and since
    when the oldest waits; nothing for a stage without a late table."""
    if not DeltaTable.is_deltatable(path, storage_options=storage_options(path)):
        return {}
    table = DeltaTable(path, storage_options=storage_options(path)).to_pyarrow_table(
        columns=[LATE_SINCE]
    )
    since = pc.min(table.column(LATE_SINCE)).as_py() if table.num_rows else None
    return {"late_master_waiting": table.num_rows, "late_master_oldest_since": since}


def ssbj_late_tuples(state: dict[str, Any] | None) -> dict[str, Any]:
    """:func:`late_tuples` of an SSBJ stage, from its controller state (the late rows and
    returned tuples its last step left, ``joins.ssbj.late``). The stored object is read as
    it is, not as a ``ControllerState``: a status report reads a state of any release, and
    must not refuse one the stage itself would refuse before its next step."""
    waiting = int((state or {}).get("late_waiting", 0))
    if not waiting:
        return {}
    assert state is not None
    oldest = state.get("late_oldest_us")
    since = None if oldest is None else datetime.fromtimestamp(int(oldest) / 1e6, UTC)
    return {"late_master_waiting": waiting, "late_master_oldest_since": since}


def pipeline_status(
    config: PipelineConfig, store: StateStore, runs_shown: int = 5
) -> dict[str, Any]:
    """Streams, stages, the last ``runs_shown`` ledger rows and each output's completeness
    per interval (:func:`pipeline.completeness.completeness_status`), as plain JSON-able
    values."""
    layout = WarehouseLayout.of(config)
    stages = {}
    for stage in config.stages:
        offset = store.offset(stage.name)
        input_path = layout.input_table(config, stage.input)
        latest = table_version(input_path) or 0
        stages[stage.name] = {
            "input": input_path,
            "consumed_version": offset.input_version,
            "latest_input_version": latest,
            "versions_behind": max(0, latest - offset.input_version),
            "steps": offset.step_seq,
            "output": layout.staged(stage.output),
            **(
                late_tuples(late_table(layout, stage.name))
                or ssbj_late_tuples(store.operator_state(stage.name))
            ),
        }
    streams = {}
    for name in config.streams:
        files = store.landing_files(name)
        statuses = [row.status for row in files]
        streams[name] = {
            "landing": config.streams[name].landing,
            "files_loaded": statuses.count(LOADED),
            "records_loaded": sum(row.records_loaded or 0 for row in files),
            "records_quarantined": sum(row.records_quarantined or 0 for row in files),
            # Records re-sent under ids earlier files had loaded (not loaded again).
            "records_resent": sum(row.records_resent or 0 for row in files),
            "files_rejected": statuses.count(REJECTED),
            "files_in_flight": statuses.count(REGISTERED),
            "files_duplicate": statuses.count(DUPLICATE),
            "files_missing": statuses.count(MISSING),
            # What an operator has to move away or fix; ingest reports these every run.
            "rejected_in_place": [
                {"path": row.path, "reason": row.error, "rejected_at": row.finished_at}
                for row in rejected_in_place(
                    store, name, zone_for(config.streams[name].landing, config.streams[name].format)
                )
            ],
        }
    runs = [
        {
            "run_id": r.run_id,
            "kind": r.kind,
            "status": r.status,
            "started_at": r.started_at,
            "seconds": ((r.finished_at - r.started_at).total_seconds() if r.finished_at else None),
            "error": r.error,
        }
        for r in store.runs(limit=runs_shown)
    ]
    return {
        "streams": streams,
        "stages": stages,
        "last_runs": runs,
        "completeness": completeness_status(config, store),
    }
