"""What every part of one SSBJ stage's step works with, fixed for the stage's lifetime: its
config, its join, the paths of its tables, the Spark session, the Delta engine and the
state store (:class:`SsbjWiring`), and the names of the operator's own tables.

Operator state lives in two Delta tables under ``_operators/<stage>/``: ``state`` (what
Algorithm 1 keeps between steps, ``pipeline.ssbj.step_pass``) and ``scan`` (the master's
copy for the cyclic scan, ``pipeline.ssbj.scan_copy``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

from common.rows import Rows
from joins.ssbj.step import JoinSpec
from pipeline.config import PipelineConfig
from pipeline.layout import WarehouseLayout
from pipeline.ssbj.warm import WarmCache
from pipeline.stage_config import EquiStage, SsbjParams
from warehouse.delta import DeltaEngine
from warehouse.state_store import StateStore

STATE_TABLE = "state"
SCAN_TABLE = "scan"
# The operator tables a step's plan pins the version of (the scan copy is pinned by the
# master versions it copies, ``plan.scan``).
TABLES = (STATE_TABLE,)
OWNED_TABLES = (STATE_TABLE, SCAN_TABLE)


@dataclass(frozen=True)
class SsbjWiring:
    """One SSBJ (or MESHJOIN) stage's config, tables and services."""

    name: str  # the stage's
    params: SsbjParams  # the stage's ``operator``
    spec: JoinSpec
    use_cache: bool  # SSBJ (and auto, when it runs this); False for MESHJOIN
    spark: SparkSession
    engine: DeltaEngine
    store: StateStore
    master_path: str
    input_path: str
    output_path: str
    tables: dict[str, str]  # operator table (TABLES) -> its path
    scan_path: str
    # (after_version, to_version) -> new input rows with _input_version and _interval_start,
    # read in the driver's memory for a step that runs there
    # (``pipeline.ssbj.placement.reads_in_driver``), else as a Spark frame.
    new_rows: Callable[[int, int], Rows]
    # What this process's steps hand to the next (``pipeline.ssbj.warm``).
    warm: WarmCache = field(default_factory=WarmCache, compare=False, repr=False)

    @property
    def state_path(self) -> str:
        return self.tables[STATE_TABLE]

    @classmethod
    def of(
        cls,
        stage: EquiStage,
        config: PipelineConfig,
        spark: SparkSession,
        engine: DeltaEngine,
        store: StateStore,
        new_rows: Callable[[int, int], Rows],
        output_path: str,
        input_path: str,
        warm: WarmCache | None = None,
    ) -> SsbjWiring:
        layout = WarehouseLayout.of(config)
        params = stage.operator
        return cls(
            name=stage.name,
            params=params,
            spec=JoinSpec(
                stream_keys=tuple(stage.join_on),
                master_keys=tuple(stage.join_on.values()),
                master_columns=tuple(config.masters[stage.master].columns),
                master_name=stage.master,
                how=stage.join,
            ),
            use_cache=params.mode in ("ssbj", "auto"),  # auto runs this when SSBJ
            spark=spark,
            engine=engine,
            store=store,
            master_path=layout.master(config, stage.master),
            input_path=input_path,
            output_path=output_path,
            tables={t: layout.operator_state(stage.name, t) for t in TABLES},
            scan_path=layout.operator_state(stage.name, SCAN_TABLE),
            new_rows=new_rows,
            warm=WarmCache() if warm is None else warm,
        )
