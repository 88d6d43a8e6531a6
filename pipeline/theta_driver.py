"""The driver of a theta stage (:class:`ThetaDriver`): A-DSP or the scheme the config names
over each batch (``joins.theta.join``), the exactly-once step of
:class:`~pipeline.stateless_driver.StatelessDriver`; with ``persist_layout`` the master's
routed layout is kept between runs (``pipeline.adsp_layout``).
"""

from __future__ import annotations

import logging

from pyspark.sql import DataFrame

from common.rows import Rows
from joins.columns import ROW_ID
from joins.theta.join import resolve_scheme, scheme_join_flagged
from pipeline.adsp_layout import AdspLayoutStage
from pipeline.emission import theta_input_accounting
from pipeline.row_bytes import MeasuredRowBytes
from pipeline.stage_config import LAYOUT_SCHEMES, ThetaStage
from pipeline.stateless_driver import StatelessDriver, StepBatch
from warehouse.delta import Snapshot

logger = logging.getLogger(__name__)


class ThetaDriver(StatelessDriver[ThetaStage]):
    """A theta stage: A-DSP (or the scheme the config names) over each batch; with
    ``persist_layout`` the master's routed layout is kept between steps."""

    def join(self, rows: DataFrame, master: Snapshot) -> DataFrame:
        return self._join(rows, master, None)

    def input_accounting(self, tuples: Rows, waiting: Rows | None, id_column: str) -> Rows:
        return theta_input_accounting(self.stage, tuples, waiting, id_column)

    def join_step(self, step: StepBatch) -> DataFrame:
        return self._join(step.rows, step.master, step)

    def _join(self, rows: DataFrame, master: Snapshot, step: StepBatch | None) -> DataFrame:
        """A scheduled step (``step`` given) may use the persisted layout; a backfill
        re-joins against an older master, so it plans afresh."""
        tuples_in = step.tuples_in if step is not None else None
        stage = self.stage
        operator = stage.operator
        stream, master_rows = self._stream_and_master(rows, master)
        row_bytes = MeasuredRowBytes(stream, master_rows)
        choice, samples = resolve_scheme(
            self.spark,
            stream,
            master_rows,
            stage.predicate,
            operator.scheme,
            operator.sample_size,
            row_bytes,
            operator.sample_above_bytes,
            known_rows=(tuples_in, master.num_records),
        )
        if operator.scheme == "auto":
            logger.info(
                "theta stage %s: auto chose %s: %s", stage.name, choice.scheme, choice.reason
            )
        if step is not None:
            step.report.extra[f"theta_scheme_{choice.scheme}"] = 1.0
        if step is not None and choice.scheme in LAYOUT_SCHEMES and operator.persist_layout:
            joined, layout = self.theta_layout(choice.scheme).join_flagged(
                stream, master, master_rows, ROW_ID, step.run_id, samples
            )
            step.report.extra.update(layout.as_metrics())
            return joined
        return scheme_join_flagged(
            self.spark,
            stream,
            master_rows,
            stage.predicate,
            choice.scheme,
            master_name=stage.master,
            master_version=master.version,
            row_id=ROW_ID,
            task_memory=operator.task_memory_bytes,
            sample_size=operator.sample_size,
            row_bytes=row_bytes,
            samples=samples,
            broadcast=operator.scheme == "auto",
        )

    def theta_layout(self, scheme: str | None = None) -> AdspLayoutStage:
        return AdspLayoutStage(
            self.stage,
            self.spark,
            self.engine,
            self.store,
            self.layout.operator_state(self.stage.name, "layout"),
            scheme,
        )
