"""``enrich maintain``: compact, then vacuum, every Delta table of the pipeline, keeping the
pinned versions and the files the followers of a table still read.

Each table is first compacted: each partition's small files are rewritten into files of
about ``warehouse.compact_target_bytes`` in one commit of dataChange=false actions, so
every version keeps its rows, a reader of the rows added between versions sees none added
or removed by it (:mod:`warehouse.delta.added_files`), and a rerun finds nothing left to
compact.

The tables: bronze and quarantine of every stream; silver, gold and quarantined batches of
every output table; the operator state tables under ``_operators/<stage>/``;
``_quality/results``; and the masters the stages read. Each existing table is vacuumed
with the retention ``warehouse.vacuum_retention_hours`` (``enrich maintain
--retention-hours`` overrides it) and ``keep_versions`` = every version any holder pins on
it (:mod:`pipeline.pins`): a pending SSBJ tuple, an open step plan, an A-DSP layout or an
audit can still read its version by time travel after the files were replaced. A bronze or
silver table nobody has pinned yet (its stages or its audit have not run) is kept from
version 0, which they will read from.

Two consequences of how vacuum works:

- A vacuum that deletes files commits ``VACUUM START`` and ``VACUUM END`` to the table's
  log, so the table's version moves although no row changed.
  :func:`only_maintenance_since` tells such versions apart from writes.
- ``keep_versions`` keeps the files of the pinned versions only, but a follower reads
  the commits after its pinned version: a stage or an audit reads the files added after
  the version it consumed (:data:`FOLLOWED_ROLES`: stage inputs and outputs, masters whose
  changes SSBJ derives from added files), which a compaction or a replace may have removed
  since; and the embedded engine's full vacuum deletes change-data files
  (``_change_data/``) older than the retention whatever ``keep_versions`` says, which the
  SSBJ cache catching up with its master reads. For a followed or change-data-feed table
  with pins, the retention is therefore stretched to cover every commit after the oldest
  pinned version.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.layout import WarehouseLayout
from pipeline.pins import table_key
from pipeline.ssbj.wiring import OWNED_TABLES as SSBJ_TABLES
from warehouse.delta import DeltaEngine, Snapshot
from warehouse.delta.api import CDF_PROPERTY, Compaction
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)

# The operator state tables a stage may own: SSBJ's, the A-DSP layout
# (ThetaDriver.theta_layout) and the tuples waiting for late master rows (pipeline.late_table).
OPERATOR_TABLES = (*SSBJ_TABLES, "layout", "late")
MAINTENANCE_OPERATIONS = frozenset({"VACUUM START", "VACUUM END", "OPTIMIZE"})
# Tables read by the rows added after a pinned version (stage inputs, audited batches, the
# changes of a master without the change data feed), not only as whole pinned versions.
FOLLOWED_ROLES = frozenset({"bronze", "silver", "master"})
# Tables every pipeline follows from their first commit: a stream's bronze (its stages) and
# an output's silver (its audit). A follower that has not run yet has pinned nothing, and
# reads every commit after version 0 when it does.
ALWAYS_FOLLOWED_ROLES = frozenset({"bronze", "silver"})
# Change-data and data files are written shortly before their commit; keep this much more.
COMMIT_MARGIN_HOURS = 1.0


@dataclass(frozen=True)
class OwnedTable:
    """A Delta table the pipeline writes or reads, and what it is to the pipeline."""

    role: str
    path: str


@dataclass(frozen=True)
class TableVacuum:
    """What ``maintain`` did to one table."""

    table: OwnedTable
    version: int
    retention_hours: float
    kept_versions: tuple[int, ...]
    deleted_files: int
    compaction: Compaction | None = None

    def summary(self) -> str:
        kept = ",".join(str(v) for v in self.kept_versions) or "none"
        compacted = ""
        if self.compaction is not None and self.compaction.version is not None:
            compacted = (
                f"compacted {self.compaction.files_removed} file(s) into "
                f"{self.compaction.files_added} (v{self.compaction.version}), "
            )
        return (
            f"{self.table.role} {self.table.path}: {compacted}{self.deleted_files} file(s) "
            f"deleted, kept pinned version(s) {kept}, retention {self.retention_hours:g}h"
        )


def owned_tables(config: PipelineConfig) -> list[OwnedTable]:
    """Every Delta table of the pipeline, once each, whether it exists yet or not."""
    layout = WarehouseLayout.of(config)
    tables: list[OwnedTable] = []
    for stream in config.streams:
        tables += [
            OwnedTable("bronze", layout.bronze(stream)),
            OwnedTable("quarantine", layout.quarantine(stream)),
        ]
    for output in config.outputs():
        tables += [
            OwnedTable("silver", layout.staged(output)),
            OwnedTable("gold", layout.published(output)),
            OwnedTable("quarantined-output", layout.quarantined_output(output)),
        ]
    for stage in config.stages:
        tables += [
            OwnedTable("operator", layout.operator_state(stage.name, part))
            for part in OPERATOR_TABLES
        ]
    tables.append(OwnedTable("quality-results", layout.quality_results()))
    tables += [OwnedTable("master", layout.master(config, name)) for name in config.masters]
    unique: dict[str, OwnedTable] = {}
    for table in tables:
        unique.setdefault(table_key(table.path), table)
    return list(unique.values())


def maintain(
    config: PipelineConfig,
    engine: DeltaEngine,
    store: StateStore,
    echo: Callable[[str], None] | None = None,
) -> list[TableVacuum]:
    """Vacuum every existing table of the pipeline; ``echo`` gets one summary line per table."""
    retention = config.warehouse.vacuum_retention_hours
    results = []
    for table in owned_tables(config):
        if not engine.exists(table.path):
            logger.debug("maintain: %s %s does not exist; skipped", table.role, table.path)
            continue
        compaction = engine.compact(table.path, config.warehouse.compact_target_bytes)
        result = replace(vacuum_table(engine, store, table, retention), compaction=compaction)
        logger.info("maintain: %s", result.summary())
        if echo is not None:
            echo(result.summary())
        results.append(result)
    deleted = sum(r.deleted_files for r in results)
    logger.info("maintain: %d table(s) vacuumed, %d file(s) deleted", len(results), deleted)
    return results


def vacuum_table(
    engine: DeltaEngine, store: StateStore, table: OwnedTable, retention_hours: float
) -> TableVacuum:
    """Vacuum one table, keeping every version pinned on it."""
    snapshot = engine.snapshot(table.path)
    pinned = store.pinned_versions(table_key(table.path))
    if not pinned and table.role in ALWAYS_FOLLOWED_ROLES:
        # Nobody has read it yet (an output's first audit, a stage's first step): they
        # will read the files added after version 0, which a compaction replaces.
        pinned = [0]
    kept = tuple(v for v in pinned if v <= snapshot.version)
    if len(kept) < len(pinned):
        logger.warning(
            "maintain: %s has version %d but pins name later versions %s; a holder pinned "
            "a table that was since recreated",
            table.path,
            snapshot.version,
            [v for v in pinned if v > snapshot.version],
        )
    followed = table.role in FOLLOWED_ROLES
    hours = _retention_for(engine, snapshot, kept, retention_hours, followed)
    # The engine takes whole hours; round up, never keep less than asked.
    deleted = engine.vacuum(table.path, math.ceil(hours), keep_versions=kept)
    return TableVacuum(table, snapshot.version, float(math.ceil(hours)), kept, len(deleted))


def only_maintenance_since(engine: DeltaEngine, path: str, version: int, latest: int) -> bool:
    """Whether every commit of ``path`` in ``(version, latest]`` is a vacuum (no data moved)."""
    if latest == version:
        return True
    if latest < version:
        return False
    commits = [
        h for h in engine.history(path, latest - version) if version < int(h["version"]) <= latest
    ]
    return len(commits) == latest - version and all(
        h.get("operation") in MAINTENANCE_OPERATIONS for h in commits
    )


def _retention_for(
    engine: DeltaEngine,
    snapshot: Snapshot,
    kept: tuple[int, ...],
    retention_hours: float,
    followed: bool,
) -> float:
    """The retention, stretched over the commits after the oldest pin of a followed or
    change-data-feed table."""
    cdf = snapshot.properties.get(CDF_PROPERTY, "false").lower() == "true"
    if not (cdf or followed) or not kept or min(kept) >= snapshot.version:
        return retention_hours
    oldest = min(kept)
    successor = [
        h
        for h in engine.history(snapshot.table_path, snapshot.version - oldest)
        if int(h["version"]) == oldest + 1
    ]
    if not successor:
        logger.warning(
            "maintain: %s: no history entry for version %d; files removed after the pinned "
            "version %d are kept only by the retention of %gh",
            snapshot.table_path,
            oldest + 1,
            oldest,
            retention_hours,
        )
        return retention_hours
    needed = _age(successor[0]["timestamp"]).total_seconds() / 3600 + COMMIT_MARGIN_HOURS
    if needed > retention_hours:
        logger.info(
            "maintain: %s: retention stretched from %gh to %.2fh to keep the files and change "
            "data a follower of pinned version %d still reads",
            snapshot.table_path,
            retention_hours,
            needed,
            oldest,
        )
        return needed
    return retention_hours


def _age(timestamp: Any) -> timedelta:
    """How old a history timestamp is: epoch ms (delta-rs) or a datetime (delta-spark, local)."""
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            return datetime.now() - timestamp
        return datetime.now(UTC) - timestamp
    return datetime.now(UTC) - datetime.fromtimestamp(float(timestamp) / 1000, UTC)
