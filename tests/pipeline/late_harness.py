"""The SSBJ harness's tiny pipeline with a plain join that waits for late master rows
(``operator.late_master``), its DuckDB oracle, and a resumable scenario for crash tests
(``python -m tests.pipeline.late_harness <dir>`` runs it in a child process)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from pipeline.handles import PipelineHandles
from pipeline.late_table import late_table
from pipeline.runner import PipelineRunner
from pipeline.status import pipeline_status
from tests.pipeline.ssbj_harness import SsbjHarness, config_for
from warehouse.delta.api import EngineChoice


class LateHarness(SsbjHarness):
    """The SSBJ harness's tiny pipeline with a plain join that waits for late master rows;
    it records each step's master version and each tuple's entry step."""

    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        how: str,
        wait: str | None,
        mode: str = "baseline",
        engine: EngineChoice = "embedded",
    ) -> None:
        """``mode`` ``ssbj`` runs SSBJ with one partition: each step is a whole R-cycle, so
        a tuple is settled at the step it enters or returns at, as the plain join's is."""
        operator = {"late_master": {"wait": wait}} if wait else {}
        super().__init__(spark, root, mode, 1, 1, how, operator=operator, engine=engine)
        self.root, self.how, self.mode = root, how, mode
        self.steps: list[int] = []  # master version of each step
        self.entries: dict[int, tuple[int, int]] = {}  # id -> (key, entry step)
        self.expired_at: dict[int, int] = {}  # id -> the step its wait expired at

    def arrive(self, tuples: Any, at: Any = None) -> None:
        super().arrive(tuples, at)
        for i, k in tuples:
            self.entries[i] = (k, len(self.steps))

    def step(self, expire: bool = False) -> None:
        """One run; with ``expire``, every tuple still waiting expires at this step."""
        if expire:
            for i in self.entries:
                self.expired_at.setdefault(i, len(self.steps))
        self.steps.append(self.engine.snapshot(self.master).version)
        self.runner.run_stage_step(self.config.stage("enrich"), f"run{len(self.steps)}")

    def reconfigure(self, wait: str | None) -> None:
        operator = {"late_master": {"wait": wait}} if wait else {}
        self.config = config_for(self.root, self.mode, 1, 1, self.how, operator=operator)
        self.runner = PipelineRunner(
            PipelineHandles(self.config, self.spark, self.engine, self.store)
        )

    def late_oracle(self) -> list[tuple[Any, ...]]:
        con = duckdb.connect()
        versions = sorted(set(self.steps))
        masters = []
        for v in versions:
            rows = DeltaTable(self.master, version=v).to_pyarrow_table()
            masters.append(rows.append_column("version", pa.array([v] * rows.num_rows, pa.int64())))
        con.register("masters", pa.concat_tables(masters))
        con.register(
            "steps", pa.table({"step": list(range(len(self.steps))), "version": self.steps})
        )
        ids = sorted(self.entries)
        last = len(self.steps) - 1
        con.register(
            "tuples",
            pa.table(
                {
                    "id": ids,
                    "k": [self.entries[i][0] for i in ids],
                    "entry": [self.entries[i][1] for i in ids],
                    "until": [self.expired_at.get(i, last) for i in ids],
                    "expires": [i in self.expired_at for i in ids],
                }
            ),
        )
        hits = """
            SELECT t.id, min(s.step) AS step FROM tuples t
            JOIN steps s ON s.step BETWEEN t.entry AND t.until
            JOIN masters m ON m.version = s.version AND m.mk = t.k
            GROUP BY t.id"""
        rows = con.execute(
            f"""SELECT t.id, t.k, m.mk, m.supplier, m.price, m.version
            FROM tuples t JOIN ({hits}) h ON h.id = t.id JOIN steps s ON s.step = h.step
            JOIN masters m ON m.version = s.version AND m.mk = t.k"""
        ).fetchall()
        if self.how == "left":
            rows += con.execute(
                f"""SELECT t.id, t.k, NULL, NULL, NULL, NULL FROM tuples t
                WHERE t.expires AND t.id NOT IN (SELECT id FROM ({hits}))"""
            ).fetchall()
        return rows

    def late_versions(self) -> tuple[int, int]:
        """The versions of the table that keeps the waiting tuples (the late table, or
        SSBJ's state table) and of the output: a step that commits moves them."""
        layout = self.layout
        kept = late_table(layout, "enrich")
        if self.mode != "baseline":
            kept = layout.operator_state("enrich", "state")
        return DeltaTable(kept).version(), DeltaTable(layout.staged("out")).version()

    def waiting(self) -> int:
        stage = pipeline_status(self.config, self.store)["stages"]["enrich"]
        return int(stage.get("late_master_waiting", 0))


def run_late_scenario(h: LateHarness) -> None:
    """Five runs, master rows landing between them for tuples that wait; the fourth run
    has no new input (it answers the last waiting tuple and empties the late table).
    Resumable: a run whose step completed, and a master change that landed, are not done
    again."""
    if not h.engine.exists(h.master):
        h.load_master([(1, 0, 1.0), (1, 1, 1.5), (2, 0, 2.0)], files=1)  # v1
    batches = [[(0, 1), (1, 3), (2, 4)], [(3, 3), (4, 2)], [(5, 4), (6, 5)], [], [(7, 1)]]
    landing = [[(3, 0, 3.0), (3, 1, 3.5)], [(4, 0, 4.0)], [(5, 0, 5.0)], [], []]
    for run, batch in enumerate(batches):
        if batch:
            h.arrive(batch)
        if h.store.offset("enrich").step_seq <= run:
            h.step()
        if landing[run] and h.engine.snapshot(h.master).version < 2 + run:
            h.update_master(landing[run], [])


def main(argv: list[str]) -> int:
    from tests.helpers import TEST_SPARK_CONF
    from warehouse.spark import SparkSettings, build_session

    spark = build_session(SparkSettings(master="local[1]", conf=TEST_SPARK_CONF))
    mode = argv[1] if len(argv) > 1 else "baseline"
    run_late_scenario(LateHarness(spark, Path(argv[0]), "left", "1h", mode))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
