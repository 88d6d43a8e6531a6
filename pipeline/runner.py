"""The pipeline runner: ingestion, then each stage's work through its driver.

The runner orchestrates: it ingests the streams, runs every stage's step or drain in
config order through the stage's :class:`~pipeline.stage_driver.StageDriver` (one
:class:`~pipeline.drivers.StageDrivers` registry picks it), reports progress and records
each step's metrics; ``pipeline.backfill`` drives backfills through the same drivers. The
runner knows no operator's internals; exactly-once and point-in-time are the drivers'
contracts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from pipeline.config import StreamConfig
from pipeline.drivers import StageDrivers
from pipeline.handles import PipelineHandles
from pipeline.schemas import QUARANTINE_SCHEMA, bronze_schema, declared_schema
from pipeline.stage_config import EquiStage, ThetaStage
from pipeline.stage_driver import StageDriver, StageReport
from warehouse.landing import IngestReport, StreamSource, ingest_stream

logger = logging.getLogger(__name__)


def stream_source(
    name: str, stream: StreamConfig, bronze_path: str, quarantine_path: str
) -> StreamSource:
    """What ingestion needs of stream ``name`` as the config declares it."""
    return StreamSource(
        name=name,
        landing_dir=Path(stream.landing),
        format=stream.format,
        schema=declared_schema(stream.columns),
        required=tuple(c.name for c in stream.columns if not c.nullable),
        bronze_path=bronze_path,
        quarantine_path=quarantine_path,
        bronze_schema=bronze_schema(stream),
        quarantine_schema=QUARANTINE_SCHEMA,
        csv_header=stream.csv_header,
        csv_delimiter=stream.csv_delimiter,
        id_column=stream.id_column,
    )


class PipelineRunner:
    """Runs the work a config declares against one warehouse and one state store."""

    def __init__(
        self,
        handles: PipelineHandles,
        progress: Callable[[str], None] | None = None,
        drivers: StageDrivers | None = None,
    ) -> None:
        self.handles = handles
        self.config, self.spark = handles.config, handles.spark
        self.engine, self.store, self.layout = handles.engine, handles.store, handles.layout
        self.drivers = drivers or StageDrivers(handles)
        self.progress = progress or (lambda message: logger.info("%s", message))

    # ------------------------------------------------------------------ ingestion

    def stream_source(self, name: str) -> StreamSource:
        return stream_source(
            name,
            self.config.streams[name],
            self.layout.bronze(name),
            self.layout.quarantine(name),
        )

    def ingest(self, run_id: str) -> list[IngestReport]:
        reports = []
        for name in self.config.streams:
            self.progress(f"ingest {name}")
            report = ingest_stream(
                self.spark, self.engine, self.store, self.stream_source(name), run_id
            )
            self.store.record_metrics(run_id, f"ingest.{name}", 0, report.as_metrics())
            reports.append(report)
        return reports

    # ------------------------------------------------------------------ stages

    def run_stages(
        self, run_id: str, steps: int | None = None, close: bool = True
    ) -> list[StageReport]:
        """Every stage's step in config order (``steps`` and ``close`` as
        :meth:`run_stage_step`'s)."""
        reports = []
        for index, stage in enumerate(self.config.stages, start=1):
            self.progress(f"stage {index}/{len(self.config.stages)}: {stage.name}")
            report = self.run_stage_step(stage, run_id, steps, close=close)
            reports.append(report)
        return reports

    def driver(self, stage: EquiStage | ThetaStage) -> StageDriver:
        """The driver of ``stage``, from the one registry this runner was built with."""
        return self.drivers.driver(stage)

    def run_stage_step(
        self,
        stage: EquiStage | ThetaStage,
        run_id: str,
        steps: int | None = None,
        drain: bool = False,
        close: bool = True,
    ) -> StageReport:
        """The stage's scheduled work (``steps`` operator steps if given, then with
        ``close`` the steps its freshness bound makes due); with ``drain``, everything
        pending is joined too."""
        driver = self.driver(stage)
        if drain:
            return self._recorded(run_id, driver.drain(run_id))
        return self._recorded(run_id, driver.step(run_id, steps, close))

    def drain(self, run_id: str) -> list[StageReport]:
        """Bring every stage up to date with its input; nothing stays pending afterwards.

        Stages run in config order, so a chained stage sees its input fully drained.
        """
        reports = []
        for stage in self.config.stages:
            self.progress(f"drain {stage.name}")
            reports.append(self._recorded(run_id, self.driver(stage).drain(run_id)))
        return reports

    def _recorded(self, run_id: str, report: StageReport) -> StageReport:
        """Record the metrics of each step the driver took, under the stage's name.

        Recorded once the driver returns, unless the driver recorded them with the step's
        completion (SSBJ): a command killed between two steps of one run loses the first
        step's metric rows (never its data; the rerun records its own).
        """
        for step in report.steps:
            if not step.recorded:
                self.store.record_metrics(run_id, report.stage, step.step, step.values)
        self.progress(
            f"{report.stage}: {len(report.steps)} step(s), {report.tuples_in:,} tuple(s) in, "
            f"{report.output_rows:,} row(s) out, {report.tuples_pending:,} pending, "
            f"{report.seconds:.1f}s"
        )
        return report
