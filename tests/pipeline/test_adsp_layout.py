"""A theta stage keeps its routed master between runs and migrates it on scheme changes."""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.theta.adsp.join import TASK, key_spec, numeric, route
from joins.theta.adsp.plan import plan_from_dict
from pipeline.adsp_layout import SLOTS
from pipeline.adsp_layout_state import STATE_KEY
from pipeline.config import parse_config
from pipeline.handles import PipelineHandles
from pipeline.layout import WarehouseLayout
from pipeline.runner import PipelineRunner
from pipeline.schemas import bronze_schema
from tests.helpers import assert_same_multiset, tiny_pipeline
from warehouse.delta import AppTransaction
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.state_store import StateStore

pytestmark = pytest.mark.slow

MASTER_SCHEMA = T.StructType(
    [T.StructField("mk", T.LongType()), T.StructField("y", T.DoubleType())]
)
EPS = 2.0
BASE = dt.datetime(2024, 1, 1)


class ThetaHarness:
    def __init__(
        self,
        spark: SparkSession,
        root: Path,
        task_memory: int,
        scheme: str = "adsp",
        operator: dict[str, Any] | None = None,
    ) -> None:
        self.spark = spark
        self.config = parse_config(
            tiny_pipeline(root, "x", "double")
            | {
                "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "y"]}},
                "stages": [
                    {
                        "name": "band",
                        "kind": "theta",
                        "input": "s",
                        "master": "m",
                        "predicate": {
                            "type": "band", "stream_column": "x", "master_column": "y", "eps": EPS
                        },
                        "join": "left",
                        "output": "out",
                        "operator": {"scheme": scheme, "task_memory_bytes": task_memory}
                        | (operator or {}),
                    }
                ],
            }
        )  # fmt: skip
        self.engine = EmbeddedDeltaEngine(spark)
        self.store = StateStore(self.config.warehouse.resolved_state_store())
        self.runner = PipelineRunner(PipelineHandles(self.config, spark, self.engine, self.store))
        self.layout = WarehouseLayout.of(self.config)
        self.master = self.layout.master(self.config, "m")
        self.bronze = self.layout.bronze("s")
        self.engine.create_table(self.bronze, bronze_schema(self.config.streams["s"]))
        self.batches: list[tuple[list[tuple[int, float]], int]] = []
        self.next_id = 0

    def load_master(self, rows: list[tuple[int, float]]) -> None:
        self.engine.create_table(self.master, MASTER_SCHEMA)
        frame = self.spark.createDataFrame(rows, MASTER_SCHEMA).repartition(2)
        self.engine.overwrite(self.master, frame)

    def run(self, xs: list[float]) -> dict[str, float]:
        batch = [(self.next_id + i, x) for i, x in enumerate(xs)]
        self.next_id += len(xs)
        rows = [(i, x, BASE + dt.timedelta(seconds=i), "f", len(self.batches)) for i, x in batch]
        schema = bronze_schema(self.config.streams["s"])
        self.engine.append(
            self.bronze,
            self.spark.createDataFrame(rows, schema),
            AppTransaction("test", len(self.batches) + 1),
        )
        self.batches.append((batch, self.engine.snapshot(self.master).version))
        report = self.runner.run_stage_step(self.config.stage("band"), f"r{len(self.batches)}")
        self.counts = (
            report.tuples_in,
            report.tuples_matched,
            report.tuples_unmatched,
            report.output_rows,
        )
        return report.extra

    def output(self) -> list[tuple[Any, ...]]:
        table = DeltaTable(self.layout.staged("out")).to_pyarrow_table(
            columns=["id", "x", "mk", "y", "_version_m"]
        )
        return [tuple(r.values()) for r in table.to_pylist()]

    def oracle(self) -> list[tuple[Any, ...]]:
        con = duckdb.connect()
        rows: list[tuple[Any, ...]] = []
        for index, (batch, version) in enumerate(self.batches):
            con.register(f"m{index}", DeltaTable(self.master, version=version).to_pyarrow_table())
            con.register(
                f"s{index}", pa.table({"id": [b[0] for b in batch], "x": [b[1] for b in batch]})
            )
            rows += con.execute(
                f"SELECT s.id, s.x, m.mk, m.y, CASE WHEN m.mk IS NULL THEN NULL ELSE {version} END "
                f"FROM s{index} s LEFT JOIN m{index} m ON m.y BETWEEN s.x - {EPS} AND s.x + {EPS}"
            ).fetchall()
        return rows

    def saved(self) -> dict[str, Any]:
        state = self.store.operator_state("band")
        assert state is not None
        return state[STATE_KEY]

    def layout_path(self) -> str:
        return self.layout.operator_state("band", "layout")


def assert_layout_is_the_plans_routing(h: ThetaHarness) -> None:
    """Every physical task holds exactly the master rows a full routing gives its plan task."""
    saved = h.saved()
    plan, instances = plan_from_dict(saved["plan"]), saved["instances"]
    master = h.engine.read(h.master).select("mk", "y")
    keys = key_spec(h.config.stage("band").predicate)  # type: ignore[union-attr]
    routed = route(
        master,
        numeric(F.col(keys.master_key), T.DoubleType()),
        plan.master,
        plan,
        "master",
        SLOTS,
        instances,
    )
    expected = Counter((r[TASK], r["mk"]) for r in routed.collect())
    actual = Counter((r[TASK], r["mk"]) for r in h.engine.read(h.layout_path()).collect())
    assert actual == expected


@pytest.mark.parametrize("scheme", ["adsp", "spark", "binning", "full"])
def test_a_step_counts_its_tuples_from_one_write(
    spark: SparkSession, tmp_path: Path, scheme: str
) -> None:
    # The step's counts come from the Delta log (tuples in) and the write's observation
    # (rows of matches, unmatched tuples): checked against the rows written and DuckDB.
    h = ThetaHarness(spark, tmp_path, 64 * 1024 * 1024, scheme)
    h.load_master([(1, 0.0), (2, 1.0), (3, 10.0), (4, 10.5)])
    h.run([0.5, 10.0, 100.0, 200.0, 0.5])  # 2 + 2 + 0 + 0 + 2 matches
    assert h.counts == (5, 3, 2, 8)
    assert_same_multiset(h.output(), h.oracle())
    h.run([300.0])
    assert h.counts == (1, 0, 1, 1)
    assert_same_multiset(h.output(), h.oracle())


def test_layout_is_kept_reused_migrated_and_rebuilt(spark: SparkSession, tmp_path: Path) -> None:
    rng = random.Random(3)
    h = ThetaHarness(spark, tmp_path, task_memory=12_000)
    h.load_master([(k, rng.uniform(0, 1000)) for k in range(1500)])

    first = h.run([rng.uniform(0, 1000) for _ in range(300)])
    assert first["layout_built"] == 1.0 and first["layout_rows_written"] > 0
    built_version = h.engine.snapshot(h.layout_path()).version
    assert_layout_is_the_plans_routing(h)

    second = h.run([rng.uniform(0, 1000) for _ in range(300)])
    assert second["layout_built"] == 0.0 and second["layout_migrated"] == 0.0
    assert h.engine.snapshot(h.layout_path()).version == built_version  # not rewritten

    # Four times the stream: the busiest task passes 80% of V and the scheme changes.
    third = h.run([rng.uniform(0, 1000) for _ in range(2400)])
    assert third["layout_migrated"] == 1.0, third
    (migration,) = h.saved()["migrations"]
    assert migration["tasks_after"] != migration["tasks_before"]
    # Only what the new scheme lacks moves: less than routing the whole master again.
    assert 0 < migration["moved_fraction_of_master"] < migration["rebuild_fraction_of_master"]
    assert migration["rows_rewritten"] == third["layout_rows_written"]
    assert_layout_is_the_plans_routing(h)

    # A new master version: the layout is rebuilt from scratch.
    h.load_master([(k, rng.uniform(0, 1000)) for k in range(1500)])
    fourth = h.run([rng.uniform(0, 1000) for _ in range(300)])
    assert fourth["layout_built"] == 1.0
    assert_layout_is_the_plans_routing(h)

    assert_same_multiset(h.output(), h.oracle())


def test_auto_chooses_adsp_through_the_runner_for_a_hot_bin_and_stays_exact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """``scheme: auto`` with broadcasting off and a band whose hot bin holds most of the
    batch: the driver samples both inputs, picks A-DSP and joins exactly (DuckDB oracle)."""
    previous = spark.conf.get("spark.sql.autoBroadcastJoinThreshold")
    spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    try:
        # sample_above_bytes 0: inputs this small would bin on their size estimate alone.
        h = ThetaHarness(spark, tmp_path, 64 * 1024 * 1024, "auto", {"sample_above_bytes": 0})
        h.load_master([(k, float(6 * k)) for k in range(10)])
        extra = h.run([7.0] * 155 + [float(i) for i in range(5)])
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", previous)
    assert extra.get("theta_scheme_adsp") == 1.0, extra
    assert_same_multiset(h.output(), h.oracle())
