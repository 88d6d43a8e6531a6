"""A small SSBJ pipeline over hand-made data, and its DuckDB oracle."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from joins.ssbj.cache.inequality import TupleSizes
from joins.ssbj.step import cache_entries
from pipeline.config import PipelineConfig, parse_config
from pipeline.context import PipelineContext
from pipeline.handles import PipelineHandles
from pipeline.layout import WarehouseLayout
from pipeline.runner import PipelineRunner
from pipeline.schemas import bronze_schema
from pipeline.ssbj.driver import SsbjDriver
from pipeline.ssbj.stage import SsbjStage
from tests.helpers import equi_stage, tiny_pipeline
from warehouse.delta import AppTransaction, DeltaEngine, open_engine
from warehouse.delta.api import EngineChoice
from warehouse.state_store import StateStore

KEY_TYPES = {"bigint": T.LongType(), "double": T.DoubleType()}


def master_schema(key_type: str = "bigint") -> T.StructType:
    return T.StructType(
        [
            T.StructField("mk", KEY_TYPES[key_type]),
            T.StructField("supplier", T.LongType()),
            T.StructField("price", T.DoubleType()),
        ]
    )


MASTER_SCHEMA = master_schema()
BASE_TIME = dt.datetime(2024, 1, 1)


def config_for(
    root: Path,
    mode: str,
    partitions: int,
    steps: int,
    how: str,
    extra: dict[str, Any] | None = None,
    operator: dict[str, Any] | None = None,
    key_type: str = "bigint",
    within: str | None = None,
) -> PipelineConfig:
    """The harness's pipeline; with ``within``, that freshness bound and no
    ``steps_per_run`` (the steps derive from the bound), else the bound ``steps`` keep."""
    steps_per_run = {} if within is not None else {"steps_per_run": steps}
    bound = within or f"{math.ceil(partitions / steps)} intervals"
    return parse_config(
        (extra or {})
        | tiny_pipeline(root, "k", key_type)
        | {
            "masters": {
                "m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "supplier", "price"]}
            },
            "stages": [
                equi_stage(
                    join=how,
                    operator={"mode": mode, "partitions": partitions}
                    | steps_per_run
                    | (operator or {}),
                    # By default the bound these steps keep: tuples wait across runs as the
                    # tests mean.
                    freshness={"complete_within": bound},
                )
            ],
        }
    )


class SsbjHarness:
    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        mode: str,
        partitions: int,
        steps: int,
        how: str,
        extra_config: dict[str, Any] | None = None,
        engine: EngineChoice = "embedded",
        operator: dict[str, Any] | None = None,
        key_type: str = "bigint",
        within: str | None = None,
    ) -> None:
        self.spark = spark
        self.config = config_for(
            root, mode, partitions, steps, how, extra_config, operator, key_type, within
        )
        self.master_schema = master_schema(key_type)
        self.engine: DeltaEngine = open_engine(spark, engine)
        self.store = StateStore(self.config.warehouse.resolved_state_store())
        self.runner = PipelineRunner(PipelineHandles(self.config, spark, self.engine, self.store))
        self.context = PipelineContext(self.config, spark, self.engine, self.store, self.runner)
        self.layout = WarehouseLayout.of(self.config)
        self.master = self.layout.master(self.config, "m")
        self.bronze = self.layout.bronze("s")
        self.batches: list[tuple[list[tuple[int, int]], int]] = []
        self.pending_batches: list[list[tuple[int, int]]] = []
        self.batch_no = 0
        self.next_id = 0  # the id arrive_keys gives its next tuple
        self.engine.create_table(self.bronze, bronze_schema(self.config.streams["s"]))

    def load_master(
        self, rows: Sequence[tuple[Any, int, float]], files: int, change_feed: bool = True
    ) -> None:
        properties = {"delta.enableChangeDataFeed": "true"} if change_feed else {}
        self.engine.create_table(self.master, self.master_schema, (), properties)
        frame = self.spark.createDataFrame(list(rows), self.master_schema)
        self.engine.append(self.master, frame.repartition(files))

    def refresh_master(self, rows: Sequence[tuple[Any, int, float]]) -> None:
        """Overwrite the master with its new content, as another writer's full refresh."""
        frame = self.spark.createDataFrame(list(rows), self.master_schema)
        self.engine.overwrite(self.master, frame.repartition(2))

    def update_master(
        self, upserts: Sequence[tuple[int, int, float]], deletes: Sequence[tuple[int, int]]
    ) -> None:
        """Change rows by (mk, supplier): upsert new prices/rows, delete some."""
        rows = [(*u, False) for u in upserts] + [(mk, sup, 0.0, True) for mk, sup in deletes]
        if rows:
            self.engine.merge(
                self.master,
                self.spark.createDataFrame(
                    rows,
                    T.StructType(
                        [*self.master_schema.fields, T.StructField("deleted", T.BooleanType())]
                    ),
                ),
                ["mk", "supplier"],
                "deleted",
            )

    def arrive_keys(self, keys: Sequence[Any]) -> None:
        """Tuples with these keys, each with the next unused id (ids count from 0, for
        tests that never give their own)."""
        self.arrive([(self.next_id + i, k) for i, k in enumerate(keys)])
        self.next_id += len(keys)

    def arrive(self, tuples: Sequence[tuple[int, Any]], at: dt.datetime | None = None) -> None:
        """Append stream tuples (id, key) to bronze, as ingestion would: event times
        ``BASE_TIME`` plus the id in seconds, or ``at`` plus the id in milliseconds."""
        self.batch_no += 1
        schema = bronze_schema(self.config.streams["s"])
        rows = [
            (
                i,
                k,
                BASE_TIME + dt.timedelta(seconds=i)
                if at is None
                else at + dt.timedelta(milliseconds=i),
                f"file{self.batch_no}",
                self.batch_no,
            )
            for i, k in tuples
        ]
        self.engine.append(
            self.bronze,
            self.spark.createDataFrame(rows, schema),
            AppTransaction("test", self.batch_no),
        )
        self.pending_batches.append(list(tuples))

    def run(self, run_id: str | None = None, steps: int | None = None, close: bool = True) -> None:
        """One scheduled run of the stage (``close``: with its closing steps); tuples that
        arrived are pinned to the current master."""
        version = self.engine.snapshot(self.master).version
        for batch in self.pending_batches:
            self.batches.append((batch, version))
        self.pending_batches = []
        self.runner.run_stage_step(
            self.config.stage("enrich"), run_id or f"run{len(self.batches)}", steps, close=close
        )

    def drain(self) -> None:
        self.runner.drain("drain")

    def operator(self) -> SsbjStage:
        """The SSBJ operator of the stage, as its driver runs it."""
        driver = self.runner.driver(self.config.stage("enrich"))
        assert isinstance(driver, SsbjDriver)
        return driver.operator

    def output(self) -> list[tuple[Any, ...]]:
        table = DeltaTable(self.layout.staged("out")).to_pyarrow_table(
            columns=["id", "k", "mk", "supplier", "price", "_version_m"]
        )
        return [tuple(r.values()) for r in table.to_pylist()]

    def paths_of(self, table: str) -> str:
        return self.layout.operator_state("enrich", table)

    def cache_rows(self) -> list[tuple[Any, ...]]:
        """H_R as the operator state table holds it: (mk, supplier, price, _empty) rows."""
        stage = self.operator()
        state = stage.state_frame()
        if state is None:
            return []
        return [tuple(r) for r in cache_entries(state, stage.wiring.spec).collect()]

    def cached_keys(self) -> set[int]:
        return {row[0] for row in self.cache_rows()}

    def measured_sizes(self) -> TupleSizes:
        state = self.store.operator_state("enrich")
        assert state is not None and state["sizes"]
        return TupleSizes(state["sizes"]["stream"], state["sizes"]["master"])

    def metric_sum(self, name: str) -> float:
        return sum(m.value for m in self.store.metrics() if m.name == name and m.stage == "enrich")

    def oracle_for_batches(self, id_groups: list[list[int]], how: str) -> list[tuple[Any, ...]]:
        """The oracle for tuples by id, all joined with the latest master version."""
        keys = {i: k for batch, _ in self.batches for i, k in batch}
        keys.update({i: k for batch in self.pending_batches for i, k in batch})
        version = self.engine.snapshot(self.master).version
        saved = self.batches
        self.batches = [([(i, keys[i]) for i in group], version) for group in id_groups]
        try:
            return self.oracle(how)
        finally:
            self.batches = saved

    def oracle(self, how: str) -> list[tuple[Any, ...]]:
        con = duckdb.connect()
        rows: list[tuple[Any, ...]] = []
        for index, (batch, version) in enumerate(self.batches):
            if not batch:
                continue
            con.register(f"m{index}", DeltaTable(self.master, version=version).to_pyarrow_table())
            con.register(
                f"s{index}", pa.table({"id": [b[0] for b in batch], "k": [b[1] for b in batch]})
            )
            join = "LEFT JOIN" if how == "left" else "JOIN"
            rows += con.execute(
                f"SELECT s.id, s.k, m.mk, m.supplier, m.price, "
                f"CASE WHEN m.mk IS NULL THEN NULL ELSE {version} END "
                f"FROM s{index} s {join} m{index} m ON s.k = m.mk"
            ).fetchall()
        return rows


SCENARIO_RUNS = 6


def run_scenario(h: SsbjHarness) -> None:
    """A resumable scenario: each run is one step; runs whose step completed are skipped."""
    if not h.engine.exists(h.master):
        h.load_master(
            [(k, s, float(10 * k + s)) for k in range(1, 6) for s in range(k % 3)], files=3
        )
    rng = __import__("random").Random(11)
    for run in range(SCENARIO_RUNS):
        batch = [(run * 10 + i, rng.choice([1, 1, 1, 2, 4, 4, 5, 77])) for i in range(6)]
        h.arrive(batch)
        if h.store.offset("enrich").step_seq > run:
            h.pending_batches = []
            h.batches.append((batch, 1))
            continue
        h.run()


CLOSING_RUNS = 4


def closing_harness(spark: SparkSession, root: Path) -> SsbjHarness:
    """k = 2 under the default bound of one interval: every run closes what it ingests."""
    return SsbjHarness(spark, root, "ssbj", 2, 1, "left", within="1 interval")


def run_closing_scenario(h: SsbjHarness) -> None:
    """Runs asked for one step each (``--steps 1``), so each closes with a second step;
    resumable as it is: a run whose steps completed finds nothing to do when rerun."""
    if not h.engine.exists(h.master):
        h.load_master(
            [(k, s, float(10 * k + s)) for k in range(1, 6) for s in range(k % 3)], files=2
        )
    rng = __import__("random").Random(5)
    for run in range(CLOSING_RUNS):
        h.arrive([(run * 10 + i, rng.choice([1, 1, 2, 3, 5, 77])) for i in range(5)])
        h.run(f"run{run}", steps=1)


def main(argv: list[str]) -> int:
    from tests.helpers import TEST_SPARK_CONF
    from warehouse.spark import SparkSettings, build_session

    spark = build_session(SparkSettings(master="local[1]", conf=TEST_SPARK_CONF))
    if argv[1:] == ["closing"]:
        run_closing_scenario(closing_harness(spark, Path(argv[0])))
    else:
        run_scenario(SsbjHarness(spark, Path(argv[0]), "ssbj", 2, 1, "left"))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
