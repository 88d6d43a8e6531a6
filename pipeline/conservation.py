"""Row conservation checks over a run's stage steps (the validate task's gate).

For every stage step of a run:

- every input row is accounted for: ``tuples_in == matched + unmatched + pending``;
- the output commit of the step holds exactly the rows the step produced
  (``output_rows``), read back from the table's log (the record counts of the files the
  commit added), not taken from the step's own counters;
- for a left join, every unmatched input row was emitted once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline.config import PipelineConfig
from pipeline.layout import WarehouseLayout
from warehouse.delta import DeltaEngine
from warehouse.delta.live_rows import rows_committed
from warehouse.state_store import StateStore

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConservationProblem:
    stage: str
    step: int
    message: str


def check_run(
    config: PipelineConfig, engine: DeltaEngine, store: StateStore, run_id: str
) -> list[ConservationProblem]:
    layout = WarehouseLayout.of(config)
    steps: dict[tuple[str, int], dict[str, float]] = {}
    for metric in store.metrics(run_id):
        steps.setdefault((metric.stage, metric.step), {})[metric.name] = metric.value
    problems = []
    for stage in config.stages:
        for (name, step), values in sorted(steps.items()):
            if name != stage.name or "output_version" not in values:
                continue
            accounted = (
                values["tuples_matched"] + values["tuples_unmatched"] + values["tuples_pending"]
            )
            if values["tuples_in"] != accounted:
                problems.append(
                    ConservationProblem(
                        name,
                        step,
                        f"{values['tuples_in']:.0f} tuple(s) in but {accounted:.0f} accounted for "
                        "(matched + unmatched + pending)",
                    )
                )
            version = int(values["output_version"])
            # From the commit's Add actions (their numRecords, taken from the written
            # files' footers), not from the step's counters; no Spark job.
            written = rows_committed(engine, layout.staged(stage.output), version - 1, version)
            if written != values["output_rows"]:
                problems.append(
                    ConservationProblem(
                        name,
                        step,
                        f"output commit v{version} of {stage.output} holds {written} row(s), the "
                        f"step produced {values['output_rows']:.0f}",
                    )
                )
    for problem in problems:
        logger.error(
            "conservation: stage %s step %d: %s", problem.stage, problem.step, problem.message
        )
    return problems
