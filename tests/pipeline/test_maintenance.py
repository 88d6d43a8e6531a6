"""`enrich maintain` and version pins: vacuum keeps exactly what the pipeline still reads."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from common.errors import EXIT_OK
from jobs.enrich import main
from pipeline.config import PipelineConfig, parse_config
from pipeline.layout import WarehouseLayout
from pipeline.maintenance import OwnedTable, maintain, only_maintenance_since, vacuum_table
from pipeline.pins import audit_pins, table_key
from pipeline.ssbj.wiring import STATE_TABLE as SSBJ_STATE_TABLE
from tests.helpers import assert_same_multiset, equi_stage, tiny_pipeline
from tests.pipeline.audit_harness import (
    FIRST_BATCH,
    SECOND_BATCH,
    arrive_and_run,
    quality_harness,
    validate,
)
from tests.pipeline.ssbj_harness import MASTER_SCHEMA, SsbjHarness
from warehouse.delta.api import CDF_PROPERTY
from warehouse.delta.embedded import EmbeddedDeltaEngine
from warehouse.state_store import StateStore

pytestmark = pytest.mark.slow

MasterRow = tuple[int, int, float]
# Version 1 of the master: keys 1-6 with one or two suppliers each, in three files.
V1: list[MasterRow] = [(k, s, float(10 * k + s)) for k in range(1, 7) for s in range(1 + k % 2)]
# Version 2 replaces every row: other prices, key 6 gone, key 7 new.
V2: list[MasterRow] = [(k, 0, float(100 + k)) for k in (1, 2, 3, 4, 5, 7)]
BATCH_A = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 1), (7, 99)]
BATCH_B = [(10, 1), (11, 6), (12, 7), (13, 2)]
HOLDER = "ssbj.enrich"


def expected_join(
    batch: Sequence[tuple[int, int]], master: Sequence[MasterRow], version: int
) -> list[tuple[Any, ...]]:
    """The inner join of tuples (id, k) with master rows (mk, supplier, price), by hand."""
    return [
        (i, k, mk, supplier, price, version)
        for i, k in batch
        for mk, supplier, price in master
        if mk == k
    ]


def with_retention(config: PipelineConfig, hours: float) -> PipelineConfig:
    warehouse = config.warehouse.model_copy(update={"vacuum_retention_hours": hours})
    return config.model_copy(update={"warehouse": warehouse})


@pytest.fixture
def pending_on_v1(spark: SparkSession, tmp_path: Path) -> Iterator[SsbjHarness]:
    """MESHJOIN with k=3: batch A entered at step 0, pinned to master v1 and still pending,
    then the master is overwritten (v2 removes every file of v1)."""
    h = SsbjHarness(spark, tmp_path, "meshjoin", partitions=3, steps=1, how="inner")
    # No change data feed: MESHJOIN only reads pinned snapshots by time travel.
    h.engine.create_table(h.master, MASTER_SCHEMA)
    h.engine.append(h.master, spark.createDataFrame(V1, MASTER_SCHEMA).repartition(3))
    assert h.engine.snapshot(h.master).version == 1
    h.arrive(BATCH_A)
    h.runner.run_stage_step(h.config.stage("enrich"), "r1")
    assert h.operator().pending_rows() == len(BATCH_A)
    h.engine.overwrite(h.master, spark.createDataFrame(V2, MASTER_SCHEMA).coalesce(1))
    assert h.engine.snapshot(h.master).version == 2
    yield h
    h.store.dispose()


def test_maintain_keeps_the_master_version_pending_tuples_are_pinned_to(
    pending_on_v1: SsbjHarness,
) -> None:
    h = pending_on_v1
    master_key = table_key(h.master)
    # the operator's scan copy of master v1: created at v0, the copy committed as v1; and
    # the bronze version the stage consumed
    bronze = table_key(h.bronze)
    consumed = h.engine.snapshot(h.bronze).version
    assert h.store.pins_of(HOLDER) == {
        master_key: [1],
        table_key(h.paths_of("scan")): [1],
        bronze: [consumed],
    }

    results = {r.table.path: r for r in maintain(with_retention(h.config, 0), h.engine, h.store)}

    assert (results[h.master].kept_versions, results[h.master].deleted_files) == ((1,), 0)
    assert_same_multiset(h.engine.read(h.master, version=1), V1)
    h.arrive(BATCH_B)
    h.runner.run_stage_step(h.config.stage("enrich"), "r2")  # batch B enters at v2
    h.drain()
    assert_same_multiset(h.output(), expected_join(BATCH_A, V1, 1) + expected_join(BATCH_B, V2, 2))
    # drained: nothing pending, only the consumed input version pinned
    assert h.store.pins_of(HOLDER) == {bronze: [h.engine.snapshot(h.bronze).version]}


def test_without_the_pins_the_same_maintain_breaks_the_pending_tuples_read(
    pending_on_v1: SsbjHarness,
) -> None:
    h = pending_on_v1
    h.arrive(BATCH_B)
    h.runner.run_stage_step(h.config.stage("enrich"), "r2")  # the scan copy follows to v2
    h.store.set_pins(HOLDER, {})

    results = {r.table.path: r for r in maintain(with_retention(h.config, 0), h.engine, h.store)}

    scan = h.paths_of("scan")
    assert results[h.master].kept_versions == results[scan].kept_versions == ()
    assert results[h.master].deleted_files == 3  # every file of v1
    assert results[scan].deleted_files > 0  # the copy of v1, which batch A still reads
    with pytest.raises(AnalysisException, match=rf"PATH_NOT_FOUND.*{re.escape(scan)}/"):
        h.runner.run_stage_step(h.config.stage("enrich"), "r3")


def test_an_open_plan_is_pinned_until_its_step_completes(
    pending_on_v1: SsbjHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = pending_on_v1
    stage = h.config.stage("enrich")
    state = h.paths_of("state")
    state_version = h.engine.snapshot(state).version
    consumed = h.engine.snapshot(h.bronze).version
    h.arrive(BATCH_B)
    arrived = h.engine.snapshot(h.bronze).version

    def crash_after_output(name: str) -> None:
        if name == "ssbj.after_output":
            raise RuntimeError(f"injected crash at {name}")

    monkeypatch.setattr("pipeline.ssbj.commit.crash_point", crash_after_output)
    with pytest.raises(RuntimeError, match="injected crash"):
        h.runner.run_stage_step(stage, "r2")  # step 1 planned at master v2, then killed
    monkeypatch.undo()

    scan = table_key(h.paths_of("scan"))
    assert h.store.pins_of(HOLDER) == {
        table_key(h.master): [1, 2],  # batch A's version and the plan's
        scan: [1, 2],  # the scan copy of each: v1 copied, v2 rewritten before the plan
        table_key(state): [state_version],  # the operator state as the plan saw it
        table_key(h.bronze): list(range(consumed, arrived + 1)),  # consumed, the plan's input
    }
    # The master moves on before the rerun; v2, which the plan reads, must survive.
    h.engine.overwrite(h.master, h.spark.createDataFrame([(1, 9, 9.0)], MASTER_SCHEMA))
    results = {r.table.path: r for r in maintain(with_retention(h.config, 0), h.engine, h.store)}
    assert results[h.master].kept_versions == (1, 2)

    h.runner.run_stage_step(stage, "r2")  # the rerun of step 1 completes
    # chunks A and B only, and the input consumed now
    assert h.store.pins_of(HOLDER) == {
        table_key(h.master): [1, 2],
        scan: [1, 2],
        table_key(h.bronze): [arrived],
    }
    h.drain()
    assert_same_multiset(h.output(), expected_join(BATCH_A, V1, 1) + expected_join(BATCH_B, V2, 2))
    # maintain compacted bronze (a version with no new rows), which the drain consumed
    drained = h.engine.snapshot(h.bronze).version
    assert drained == arrived + 1
    assert h.store.pins_of(HOLDER) == {table_key(h.bronze): [drained]}


def test_a_baseline_step_keeps_only_the_consumed_version_pinned_when_done(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = SsbjHarness(spark, tmp_path, "baseline", partitions=1, steps=1, how="inner")
    h.engine.create_table(h.master, MASTER_SCHEMA)
    h.engine.append(h.master, spark.createDataFrame(V1, MASTER_SCHEMA))
    h.arrive(BATCH_A)
    pins: list[dict[str, list[int]]] = []
    real_plan_step = h.store.plan_step

    def plan_step(*args: Any) -> Any:
        pins.append(h.store.pins_of("stage.enrich"))
        return real_plan_step(*args)

    monkeypatch.setattr(h.store, "plan_step", plan_step)
    h.runner.run_stage_step(h.config.stage("enrich"), "r1")

    bronze = h.engine.snapshot(h.bronze).version
    assert pins == [{table_key(h.master): [1], table_key(h.bronze): list(range(0, bronze + 1))}]
    assert h.store.pins_of("stage.enrich") == {table_key(h.bronze): [bronze]}  # consumed
    assert_same_multiset(h.output(), expected_join(BATCH_A, V1, 1))
    h.store.dispose()


def test_audit_pins_name_the_audited_output_and_pending_versions(tmp_path: Path) -> None:
    layout = WarehouseLayout(str(tmp_path / "wh"))
    silver = str(tmp_path / "wh" / "silver" / "out")
    pending = layout.operator_state("enrich", SSBJ_STATE_TABLE)
    assert pending == str(tmp_path / "wh" / "_operators" / "enrich" / "state")
    state = {
        "output_version": 7,
        "input_version": 4,
        "pending_version": 3,
        "pending_table": pending,
        "quarantined": [],
    }

    assert audit_pins(layout, "out", state) == {pending: [3], silver: [7]}
    # A stateless stage records no pending version; a fresh audit state starts at version 0.
    assert audit_pins(layout, "out", {**state, "pending_version": None}) == {silver: [7]}
    assert audit_pins(layout, "out", {"output_version": 0, "quarantined": []}) == {silver: [0]}
    # A version recorded without its table (an earlier release's) is not pinned anywhere.
    legacy = {**state, "pending_table": None}
    assert audit_pins(layout, "out", legacy) == {silver: [7]}
    # Decided but not recorded: finishing re-reads batch (7, 9] at 9 and records pending 5.
    intent = {
        "batch": [7, 9],
        "action": "published",
        "record": {"pending_version": 5, "pending_table": pending},
    }
    assert audit_pins(layout, "out", {**state, "intent": intent}) == {
        pending: [3, 5],
        silver: [7, 9],
    }


def test_vacuum_commits_are_told_apart_from_writes(spark: SparkSession, tmp_path: Path) -> None:
    engine = EmbeddedDeltaEngine(spark)
    path = str(tmp_path / "t")
    engine.create_table(path, MASTER_SCHEMA)
    engine.append(path, spark.createDataFrame(V1, MASTER_SCHEMA))
    written = engine.overwrite(path, spark.createDataFrame(V2, MASTER_SCHEMA)).table_version
    assert engine.vacuum(path, 0)  # deletes v1's files: commits VACUUM START and END
    vacuumed = engine.snapshot(path).version

    assert vacuumed == written + 2
    assert only_maintenance_since(engine, path, written, vacuumed)
    assert not only_maintenance_since(engine, path, written - 1, vacuumed)
    assert only_maintenance_since(engine, path, vacuumed, vacuumed)


@pytest.mark.parametrize("pinned", [True, False])
def test_change_data_after_a_pinned_version_survives_a_short_retention(
    spark: SparkSession, tmp_path: Path, pinned: bool
) -> None:
    # An SSBJ cache at master v1 catches up by reading the change data feed after v1.
    engine = EmbeddedDeltaEngine(spark)
    store = StateStore(f"sqlite:///{tmp_path / 'state.db'}")
    path = str(tmp_path / "m")
    engine.create_table(path, MASTER_SCHEMA, (), {CDF_PROPERTY: "true"})
    engine.append(path, spark.createDataFrame(V1, MASTER_SCHEMA).coalesce(1))
    update = [(1, 0, -1.0)]
    engine.merge(path, spark.createDataFrame(update, MASTER_SCHEMA), ["mk", "supplier"])
    assert list((tmp_path / "m" / "_change_data").iterdir())
    if pinned:
        store.set_pins("ssbj.enrich", {table_key(path): [1]})

    result = vacuum_table(engine, store, OwnedTable("master", path), 0)

    change_files = list((tmp_path / "m" / "_change_data").iterdir())
    if pinned:
        assert result.kept_versions == (1,) and result.retention_hours >= 1 and change_files
        assert_same_multiset(
            engine.changes(path, 1, 2).select("mk", "supplier", "price", "_change_type"),
            [(1, 0, 10.0, "update_preimage"), (1, 0, -1.0, "update_postimage")],
        )
    else:
        assert result.retention_hours == 0 and not change_files
        with pytest.raises(Exception, match=r"_change_data.*not found"):
            engine.changes(path, 1, 2)
    store.dispose()


def test_enrich_maintain_vacuums_every_existing_table_and_prints_a_line_each(
    spark: SparkSession, workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = tiny_pipeline(workdir, "k", "bigint") | {
        "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "price"]}},
        "stages": [equi_stage(operator={"mode": "meshjoin", "partitions": 2})],
    }
    config_file = workdir / "pipeline.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = parse_config(raw)
    layout = WarehouseLayout.of(config)
    engine = EmbeddedDeltaEngine(spark)
    bronze, master = layout.bronze("s"), layout.master(config, "m")
    engine.create_table(master, MASTER_SCHEMA)
    engine.append(master, spark.createDataFrame(V1, MASTER_SCHEMA).coalesce(1))
    engine.overwrite(master, spark.createDataFrame(V2, MASTER_SCHEMA).coalesce(1))
    engine.create_table(bronze, MASTER_SCHEMA)
    capsys.readouterr()

    # The configured retention (the default week) keeps v1's file, replaced a moment ago.
    assert main(["--config", str(config_file), "maintain"]) == EXIT_OK
    # Bronze is kept from version 0 for its stage, which has not run yet.
    assert capsys.readouterr().out.splitlines() == [
        f"bronze {bronze}: 0 file(s) deleted, kept pinned version(s) 0, retention 168h",
        f"master {master}: 0 file(s) deleted, kept pinned version(s) none, retention 168h",
    ]
    assert main(["--config", str(config_file), "maintain", "--retention-hours", "0"]) == EXIT_OK
    assert capsys.readouterr().out.splitlines() == [
        f"bronze {bronze}: 0 file(s) deleted, kept pinned version(s) 0, retention 0h",
        f"master {master}: 1 file(s) deleted, kept pinned version(s) none, retention 0h",
    ]
    assert_same_multiset(engine.read(master), V2)

    # The published table's small files (one per publish) are compacted, then vacuumed;
    # bronze (empty) and the master (one file) have nothing to compact.
    gold = layout.published("out")
    engine.create_table(gold, MASTER_SCHEMA)
    for row in V1[:3]:
        engine.append(gold, spark.createDataFrame([row], MASTER_SCHEMA).coalesce(1))
    assert main(["--config", str(config_file), "maintain", "--retention-hours", "0"]) == EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert f"gold {gold}: compacted 3 file(s) into 1 (v4), 3 file(s) deleted, " in lines[1]
    assert not any("compacted" in line for line in lines if not line.startswith("gold"))
    assert_same_multiset(engine.read(gold), V1[:3])
    assert len(engine.snapshot(gold).files) == 1
    assert main(["--config", str(config_file), "maintain"]) == EXIT_OK
    assert "compacted" not in capsys.readouterr().out  # nothing small is left


def drain_and_check_gold(h: SsbjHarness) -> None:
    """Drain and publish what is left: gold must then equal the oracle's left join."""
    h.drain()
    assert validate(h, "drain") == 0
    oracle_columns = ["id", "k", "mk", "supplier", "price", "_version_m"]
    assert_same_multiset(
        h.engine.read(h.layout.published("out")).select(*oracle_columns), h.oracle("left")
    )


def test_maintain_between_runs_compacts_every_table_and_the_pipeline_loses_nothing(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Bronze holds batches the stage has not read, silver a batch the audit has not
    audited, when maintain compacts every table and vacuums with no retention: the followers
    read the same rows from the files the compaction replaced, so every tuple is published
    once, as DuckDB joins it."""
    h = quality_harness(spark, tmp_path, steps=1)  # SSBJ, left join, k = 2
    arrive_and_run(h, FIRST_BATCH, "r0")
    assert validate(h, "r0") == 0
    arrive_and_run(h, SECOND_BATCH, "r1")  # staged, not audited
    for row in [(21, 4), (22, 77), (23, 1)]:
        h.arrive([row])  # three small files the stage has not read
    h.pending_batches = [[(21, 4), (22, 77), (23, 1)]]  # they enter at the next run as one

    results = {
        r.table.role + ":" + r.table.path: r
        for r in maintain(with_retention(h.config, 0), h.engine, h.store)
    }
    bronze = results[f"bronze:{h.bronze}"]
    silver = results[f"silver:{h.layout.staged('out')}"]
    for followed in (bronze, silver):
        assert followed.compaction is not None and followed.compaction.version is not None
        assert followed.retention_hours >= 1  # stretched over the commits after the pin
    assert bronze.compaction is not None and bronze.compaction.files_removed >= 5

    h.run("r2")
    assert validate(h, "r2") == 0
    drain_and_check_gold(h)
    assert h.context.auditor.unresolved() == []
    h.store.dispose()


def test_maintain_before_an_output_s_first_audit_keeps_the_batches_it_will_publish(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two runs stage silver's first batches before any validate, so the audit has saved
    no state and pinned nothing; maintain with no retention compacts silver. The audit
    still reads the files added after version 0 and publishes every tuple once (found by
    the soak: its vacuum deleted them and the first validate failed)."""
    h = quality_harness(spark, tmp_path, steps=1)  # SSBJ, left join, k = 2
    arrive_and_run(h, FIRST_BATCH, "r0")
    arrive_and_run(h, SECOND_BATCH, "r1")
    assert h.store.pins_of("audit.out") == {}

    results = {
        r.table.role + ":" + r.table.path: r
        for r in maintain(with_retention(h.config, 0), h.engine, h.store)
    }
    silver = results[f"silver:{h.layout.staged('out')}"]
    assert silver.kept_versions == (0,)
    assert silver.compaction is not None and silver.compaction.files_removed >= 2
    assert silver.retention_hours >= 1  # stretched over every commit after version 0

    assert validate(h, "r1") == 0
    drain_and_check_gold(h)
    h.store.dispose()


@pytest.mark.parametrize("pinned", [True, False])
def test_the_consumed_input_version_stays_pinned_so_a_compaction_cannot_lose_new_rows(
    spark: SparkSession, tmp_path: Path, pinned: bool
) -> None:
    h = SsbjHarness(spark, tmp_path, "baseline", partitions=1, steps=1, how="inner")
    h.load_master(V1, files=1)
    h.arrive(BATCH_A)
    h.run("r1")
    consumed = h.engine.snapshot(h.bronze).version
    assert h.store.pins_of("stage.enrich") == {table_key(h.bronze): [consumed]}
    for row in BATCH_B:
        h.arrive([row])
    if not pinned:
        h.store.set_pins("stage.enrich", {})

    results = {r.table.path: r for r in maintain(with_retention(h.config, 0), h.engine, h.store)}

    compaction = results[h.bronze].compaction
    assert compaction is not None and compaction.files_removed > len(BATCH_B)
    # Without its pin, bronze counts as followed from version 0 (as before a stage's first
    # step): more is kept, nothing the next step reads is lost.
    assert results[h.bronze].kept_versions == ((consumed,) if pinned else (0,))
    assert results[h.bronze].deleted_files == 0
    h.run("r2")
    assert_same_multiset(h.output(), h.oracle("inner"))
    h.store.dispose()
