"""The SSBJ operator's copy of the master for the cyclic scan (the ``scan`` table), and
partition p of k of a master version, which a step's disk phase reads.

The copy is partitioned by ``_scan_part`` = hash(row) mod k, so partition p of every
version holds |R|/k rows however the master's writer laid out its files
(``joins.ssbj.step.scan_rows``). It follows the master forward one sync per new master
version, each an idempotent commit: see :func:`scan_versions`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from common.faults import crash_point
from joins.ssbj.mesh_partitions import partition_by_bytes
from joins.ssbj.step import SCAN_PART, scan_rows
from pipeline.ssbj.wiring import SsbjWiring
from warehouse.delta import AppTransaction, DataFile, Snapshot

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScanVersions:
    """The scan-copy version of each master version a step needs (-1: never copied), and
    the seconds the step spent creating the copy (0.0 unless this step made its first
    version for this k: a setup paid once, which ``mode: auto`` does not count as the
    cost of the tuples, ``pipeline.mode_costs``)."""

    versions: dict[str, int]
    created_seconds: float = 0.0


def scan_versions(
    w: SsbjWiring,
    saved: Mapping[str, int],
    saved_partitions: int | None,
    master: Snapshot,
    needed: set[int],
) -> ScanVersions:
    """Scan-copy versions of the master versions ``needed`` (by the ``saved`` ones, of
    ``saved_partitions``, and a sync of the copy to ``master``), for the step's plan and
    the state after it.

    The copy follows the master forward one sync per new master version, each an
    idempotent commit (app transaction ``(scan.k<k>, master version + 1)``), so the
    table itself says which master version it last copied even after a crash. An
    append-only change (every earlier file still live with its rows) appends the new
    files' rows; anything else rewrites the copy from the new snapshot. Versions the
    copy never held (state from before the copy existed) map to -1: their partitions
    are read from the master's files instead.
    """
    k = w.params.partitions
    mapping = {int(v): int(t) for v, t in saved.items() if saved_partitions == k}
    app = f"ssbj.{w.name}.scan.k{k}"
    synced = (
        w.engine.transaction_version(w.scan_path, app) if w.engine.exists(w.scan_path) else None
    )
    created = 0.0
    if synced is not None and synced - 1 == master.version:
        mapping.setdefault(master.version, w.engine.snapshot(w.scan_path).version)
    elif synced is None or synced - 1 < master.version:
        started = time.monotonic()
        mapping[master.version] = sync_scan(
            w, master, synced, AppTransaction(app, master.version + 1)
        )
        if synced is None:  # the copy's first version (for this k): a one-off setup
            created = time.monotonic() - started
    return ScanVersions({str(v): mapping.get(v, -1) for v in sorted(needed)}, created)


def sync_scan(w: SsbjWiring, master: Snapshot, synced: int | None, txn: AppTransaction) -> int:
    """Bring the scan copy to ``master``; returns the copy's table version."""
    k = w.params.partitions
    previous = w.engine.snapshot(w.master_path, synced - 1) if synced is not None else None
    now = {f.path: f.num_records for f in master.files}
    appended = previous is not None and all(
        now.get(f.path, -1) == f.num_records for f in previous.files
    )
    if previous is not None and appended:
        known = {f.path for f in previous.files}
        new_files = [f for f in master.files if f.path not in known]
        rows = scan_rows(w.engine.read_files(master, new_files), w.spec, k)
        outcome = w.engine.append(w.scan_path, rows, txn)
    else:
        rows = scan_rows(w.engine.read_files(master), w.spec, k)
        w.engine.create_table(w.scan_path, rows.schema, (SCAN_PART,))
        outcome = w.engine.overwrite(w.scan_path, rows, txn)
    crash_point("ssbj.after_scan_sync")
    logger.info(
        "ssbj %s: scan copy of master v%d at v%d (%s, k=%d)",
        w.name,
        master.version,
        outcome.table_version,
        "appended" if appended else "rewritten",
        k,
    )
    return outcome.table_version


def partition(
    w: SsbjWiring, snapshot: Snapshot, index: int, parts: int, scan: Mapping[str, int]
) -> tuple[Snapshot, list[DataFile]]:
    """Partition ``index`` of k of a master version: the table version and the files
    that hold it (the scan copy's, or the version's own split by bytes)."""
    scan_version = scan.get(str(snapshot.version), -1)
    if scan_version >= 0:
        copy = w.engine.snapshot(w.scan_path, scan_version)
        return copy, [f for f in copy.files if f.partition_values.get(SCAN_PART) == index]
    # a version pinned before the scan copy existed: split its files by bytes
    groups = partition_by_bytes([(f.path, f.size_bytes) for f in snapshot.files], parts)
    return snapshot, [f for f in snapshot.files if f.path in set(groups[index])]
