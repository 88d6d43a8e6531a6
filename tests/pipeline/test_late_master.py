"""``operator.late_master``: tuples wait for master rows that arrive after them, through the
runner, against a DuckDB oracle of the same rule.

The oracle: a tuple entering at step ``e`` is probed at every step from ``e`` until its wait
expires, each against that step's master version; it is answered from the first probed
version with rows of its key (those rows, that version); a tuple never answered emits one
unmatched row at expiry (left join) or nothing (inner join), and one not yet expired has no
rows yet.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from common.errors import ConfigError, ValidationFailedError
from pipeline.config import SsbjParams
from pipeline.late_table import late_table
from pipeline.runner import PipelineRunner
from pipeline.stateless_driver import EquiBaselineDriver
from pipeline.status import pipeline_status
from tests.helpers import assert_same_multiset
from tests.pipeline.audit_harness import (
    arrive_and_run,
    defect_in,
    drop_tuple,
    published_rows,
    quality_harness,
    validate,
)
from tests.pipeline.ssbj_harness import SsbjHarness, config_for

MASTER = [(1, 0, 1.0), (1, 1, 1.5), (2, 0, 2.0)]


class LateHarness(SsbjHarness):
    """The SSBJ harness's tiny pipeline with a plain join that waits for late master rows;
    it records each step's master version and each tuple's entry step."""

    def __init__(self, spark: SparkSession, root: Path, how: str, wait: str | None) -> None:
        operator = {"late_master": {"wait": wait}} if wait else {}
        super().__init__(spark, root, "baseline", 1, 1, how, operator=operator)
        self.root, self.how = root, how
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
        self.config = config_for(self.root, "baseline", 1, 1, self.how, operator=operator)
        self.runner = PipelineRunner(self.config, self.spark, self.engine, self.store)

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

    def waiting(self) -> int:
        stage = pipeline_status(self.config, self.store)["stages"]["enrich"]
        return int(stage.get("late_master_waiting", 0))


def add_master_rows(h: LateHarness, rows: list[tuple[int, int, float]]) -> None:
    h.update_master(rows, [])


@pytest.mark.parametrize("how", ["left", "inner"])
def test_tuples_wait_for_late_master_rows_and_take_the_first_version_with_their_key(
    spark: SparkSession, tmp_path: Path, how: str
) -> None:
    h = LateHarness(spark, tmp_path, how, "1h")
    h.load_master(MASTER, files=1)
    h.arrive([(0, 1), (1, 2), (2, 3), (3, 4)])
    h.step()  # keys 3 and 4 have no rows: they wait
    assert h.waiting() == 2
    assert_same_multiset(h.output(), h.late_oracle())

    add_master_rows(h, [(3, 0, 3.0), (3, 1, 3.5), (1, 0, -1.0)])  # key 3 lands, key 1 changes
    h.arrive([(4, 3), (5, 5), (6, 1)])
    h.step()  # the waiting key-3 tuple and the new one are answered from this version
    assert h.waiting() == 2  # keys 4 and 5
    add_master_rows(h, [(4, 0, 4.0), (5, 0, 5.0)])
    h.step()  # no new input: the step still runs for the waiting tuples
    assert h.waiting() == 0
    h.step()  # nothing new and nothing waiting
    assert_same_multiset(h.output(), h.late_oracle())
    versions = {r[0]: r[5] for r in h.output()}
    assert versions[2] == versions[4] and versions[3] == versions[5] > versions[4]


@pytest.mark.parametrize("how", ["left", "inner"])
def test_a_tuple_whose_wait_expires_is_emitted_unmatched_or_dropped(
    spark: SparkSession, tmp_path: Path, how: str
) -> None:
    """The wait is measured in time: a one-second wait has expired at a step two seconds
    later. Dropping ``late_master`` from the config expires every waiting tuple at the next
    step, so nothing is left behind in the late table."""
    h = LateHarness(spark, tmp_path, how, "1s")
    h.load_master(MASTER, files=1)
    h.arrive([(0, 1), (1, 9)])
    h.step()
    assert h.waiting() == 1
    time.sleep(2.0)
    h.expired_at[1] = len(h.steps)
    h.step()  # tuple 1's wait is over
    assert h.waiting() == 0

    h.reconfigure("1h")
    h.arrive([(2, 9), (3, 2)])
    h.step()
    assert h.waiting() == 1
    h.reconfigure(None)  # the config no longer waits: the waiting tuple expires now
    h.step(expire=True)
    assert h.waiting() == 0
    assert_same_multiset(h.output(), h.late_oracle())


def test_late_master_is_refused_for_ssbj_and_auto_picks_the_plain_join(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ValueError, match="late_master: the plain join waits"):
        SsbjParams.model_validate({"mode": "ssbj", "late_master": {"wait": "1h"}})
    with pytest.raises(ValueError, match="longer than zero"):
        SsbjParams.model_validate({"late_master": {"wait": "0s"}})
    with pytest.raises(ConfigError, match="wait"):
        config_for(tmp_path, "baseline", 1, 1, "left", operator={"late_master": {}})
    h = SsbjHarness(spark, tmp_path, "auto", 1, 1, "left", operator={"late_master": {"wait": "1h"}})
    with caplog.at_level(logging.INFO, logger="pipeline.drivers"):
        assert type(h.runner.driver(h.config.stage("enrich"))) is EquiBaselineDriver
    assert "auto chose baseline: operator.late_master is set" in caplog.text


def test_the_audit_counts_waiting_tuples_as_pending_and_publishes_each_answer_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Write-audit-publish over a stage that waits for late master rows: a waiting tuple is
    one of the stage's pending tuples at each audit (the suite's conservation and freshness
    checks pass), its answer is published once when its key lands, and a step that loses a
    waiting tuple from the late table fails row conservation."""
    h = quality_harness(spark, tmp_path, mode="baseline", operator={"late_master": {"wait": "1h"}})
    late = late_table(h.layout, "enrich")
    arrive_and_run(h, [(1, 1), (2, 3), (3, 9), (4, 4)], "r1")  # keys 3 and 9: no rows yet
    assert validate(h, "r1") == 0
    assert {r["id"] for r in h.engine.read(late).collect()} == {2, 3}

    h.update_master([(9, 0, 90.0)], [])
    arrive_and_run(h, [(5, 2)], "r2")  # tuple 3 is answered from this master version
    assert validate(h, "r2") == 0
    published = published_rows(h)
    assert [r[:2] for r in published if r[0] == 3] == [(3, 9)]
    assert {r[0] for r in published} == {1, 3, 4, 5}  # tuple 2 still waits

    h.arrive([(6, 3)])
    with defect_in(h, late, drop_tuple(2)):
        h.run("r3")
    with pytest.raises(ValidationFailedError, match="row conservation: a tuple vanished"):
        validate(h, "r3")
