"""Where each table of a pipeline lives under the warehouse root.

``bronze/<stream>``      ingested stream rows, one commit per landing file
``quarantine/<stream>``  malformed records with their reason and source file
``silver/<table>``       stage outputs as the operators write them: the audit's staging area
``gold/<table>``         published outputs: only batches that passed their quality suites
``quarantine/_outputs/<table>``  output batches that failed, with the failed expectations
``_quality/``            the Great Expectations project (stores, Data Docs) and ``results``
``_reports/``            HTML run reports
``_operators/<stage>``   bulk operator state (SSBJ cache and pending queue, A-DSP layout)
``_state/``              the SQLite state store of the embedded default
``_stream/<query>``      the continuous mode's Structured Streaming checkpoints

The root may be an object store (``s3://bucket/prefix``). What is not a table (the Great
Expectations project, the run reports, the SQLite state store) lives under the driver's
local folder (``warehouse.local_root``), which is the root itself when that is local.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError
from pipeline.config import PipelineConfig


@dataclass(frozen=True)
class WarehouseLayout:
    root: str
    # The driver's local folder; the root when None.
    local_root: str | None = None

    @classmethod
    def of(cls, config: PipelineConfig) -> WarehouseLayout:
        return cls(config.warehouse.root.rstrip("/"), config.warehouse.driver_root().rstrip("/"))

    @property
    def driver_root(self) -> str:
        return self.local_root if self.local_root is not None else self.root

    def bronze(self, stream: str) -> str:
        return f"{self.root}/bronze/{stream}"

    def quarantine(self, stream: str) -> str:
        return f"{self.root}/quarantine/{stream}"

    def staged(self, table: str) -> str:
        """Where a stage writes its output table before the audit publishes it (silver)."""
        return f"{self.root}/silver/{table}"

    def published(self, table: str) -> str:
        """Where the audit publishes the batches that passed (gold)."""
        return f"{self.root}/gold/{table}"

    def quarantined_output(self, table: str) -> str:
        return f"{self.root}/quarantine/_outputs/{table}"

    def quality_results(self) -> str:
        return f"{self.root}/_quality/results"

    def gx_project(self) -> str:
        return f"{self.driver_root}/_quality"

    def reports(self) -> str:
        return f"{self.driver_root}/_reports"

    def stream_checkpoint(self, query: str) -> str:
        """The checkpoint of one Structured Streaming query of ``enrich stream``."""
        return f"{self.root}/_stream/{query}"

    def operator_state(self, stage: str, part: str) -> str:
        return f"{self.root}/_operators/{stage}/{part}"

    def master(self, config: PipelineConfig, name: str) -> str:
        table = config.masters[name].table
        if "://" in table or Path(table).is_absolute():
            return table
        return f"{self.root}/{table}"

    def input_table(self, config: PipelineConfig, name: str) -> str:
        """The table a stage reads: a stream's bronze table or an earlier stage's output."""
        if name in config.streams:
            return self.bronze(name)
        if any(s.output == name for s in config.stages):
            return self.staged(name)
        raise ConfigError(f"{name!r} is neither a stream nor a stage output")
