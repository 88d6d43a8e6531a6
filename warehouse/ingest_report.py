"""What one ingest of a stream did: its counts (:class:`IngestReport`) and the log of its
problems (:class:`IngestLog`), shared by admission (:mod:`warehouse.landing`) and the bronze
load (:mod:`warehouse.bronze_load`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime

from warehouse.state_store import StateStore
from warehouse.state_tables import REJECTED, LandingFile

logger = logging.getLogger("warehouse.landing")


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class IngestReport:
    stream: str
    files_loaded: int = 0
    files_skipped: int = 0
    files_rejected: int = 0
    files_missing: int = 0
    # Rejected files still in the landing directory after this run, old and new.
    files_rejected_in_place: int = 0
    records_received: int = 0
    records_loaded: int = 0
    records_quarantined: int = 0
    # Records whose id an earlier file loaded with the same content (not loaded again); a
    # re-sent id with other content is counted as quarantined.
    records_resent: int = 0
    errors: list[str] = field(default_factory=list)

    def as_metrics(self) -> dict[str, float]:
        """Every count, under its field's name (the metrics table's)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.type == "int"}


class IngestLog:
    """An ingest's report and the problems it reports: each rejected file once a run, every
    error logged and kept for the run's exit code."""

    def __init__(self, store: StateStore, report: IngestReport) -> None:
        self.store, self.report = store, report
        self.reported: set[str] = set()  # paths whose problem this run already reported

    def reject(self, row: LandingFile, message: str) -> None:
        self.store.update_landing_file(row.id, status=REJECTED, error=message, finished_at=now())
        self.rejected(row.path, message)

    def rejected(self, path: str, message: str) -> None:
        self.report.files_rejected += 1
        self.reported.add(path)
        self.report_error(message)

    def report_error(self, message: str) -> None:
        logger.error("%s", message)
        self.report.errors.append(message)
