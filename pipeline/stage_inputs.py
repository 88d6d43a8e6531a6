"""What a stage reads: the rows added to its input between two versions, stamped with
their schedule interval, and the configured columns of its master at a snapshot.

One place for "the new rows of an input" (the live step, the SSBJ operator and the audit
all read them the same way): rows of files added in (after, to] that are still live at
``to`` (see :func:`warehouse.delta.api.live_rows_added`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from common.errors import ConfigError
from common.rows import Frame, Rows
from joins.columns import with_interval_start
from joins.ssbj.step import INPUT_VERSION
from pipeline.config import PipelineConfig
from pipeline.layout import WarehouseLayout
from pipeline.stage_config import EquiStage, ThetaStage
from warehouse.delta import COMMIT_VERSION, DeltaEngine, Snapshot
from warehouse.delta.live_rows import live_rows_added

AnyStage = EquiStage | ThetaStage  # a stage of either kind (config.Stage is its parser)


class StageInputs:
    """Reads a stage's input and master for one config, warehouse and engine."""

    def __init__(self, config: PipelineConfig, engine: DeltaEngine) -> None:
        self.config = config
        self.engine = engine
        self.layout = WarehouseLayout.of(config)

    def input_path(self, stage: AnyStage) -> str:
        return self.layout.input_table(self.config, stage.input)

    def master_path(self, stage: AnyStage) -> str:
        return self.layout.master(self.config, stage.master)

    def new_rows(
        self, stage: AnyStage, after_version: int, to_version: int, keep_version: bool = False
    ) -> Rows:
        """Input rows added in (after_version, to_version], with ``_interval_start``; with
        ``keep_version`` also the version that added each, as ``_input_version``. Read in
        the driver's memory (a small batch's audit or step) or as a Spark frame."""
        added = live_rows_added(
            self.engine, self.input_path(stage), after_version, to_version, keep_version
        )
        return self.with_interval(stage, Rows.apply(_input_version, added))

    def with_interval(self, stage: AnyStage, rows: Rows) -> Rows:
        """``rows`` of the stage's input stamped with the schedule interval they fall in."""
        root = self.config.root_stream(stage.input)
        interval = int(self.config.schedule.interval_delta.total_seconds())
        return with_interval_start(rows, self.config.streams[root].event_time, interval)

    def master_rows(self, stage: AnyStage, master: Snapshot) -> DataFrame:
        """The configured columns of ``master``; a ConfigError names any it lacks."""
        columns = self.config.masters[stage.master].columns
        missing = [c for c in columns if c not in master.schema.fieldNames()]
        if missing:
            raise ConfigError(
                f"masters.{stage.master}.columns: {missing} are not columns of "
                f"{master.table_path} (it has {master.schema.fieldNames()})"
            )
        return self.engine.read_files(master).select(*columns)


def _input_version(rows: Frame) -> Frame:
    """The commit version of each added row, where read, as ``_input_version``."""
    if COMMIT_VERSION not in rows.collect_schema():
        return rows
    return rows.rename({COMMIT_VERSION: INPUT_VERSION})
