"""SSBJ and MESHJOIN stages whose tuples wait for late master rows (``joins/ssbj/late.py``),
through the runner, with k = 2 partitions (a tuple's cycle spans steps), against oracles.

The exact oracle (MESHJOIN: no cache, so a tuple's path depends on the steps alone): a tuple
enters at the first step after it arrives, pinned to that step's master version, and
leaves H_S k steps later; if that version had no row of its key it becomes a late row
pinned to it. A late row returns at the first step whose master version is newer, for a
whole cycle again, and so on; it is answered from the version of the cycle that met its
key. A step runs when input is new, H_S is not empty, or a late row would return.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from common.errors import ConfigError
from joins.ssbj.late import (
    LATE,
    LATE_SINCE,
    PINNED_VERSION,
    RETURNING,
    ROLE,
    LateRule,
    settle_unmatched,
    sort_late_rows,
)
from pipeline.backfill import rejoin_interval
from pipeline.handles import PipelineHandles
from pipeline.runner import PipelineRunner
from pipeline.status import pipeline_status
from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import BASE_TIME, SsbjHarness, config_for

K = 2
MASTER = [(1, 0, 1.0), (1, 1, 1.5), (2, 0, 2.0)]


@dataclass
class Tuple:
    """The oracle's view of one stream tuple."""

    id: int
    key: int
    state: str = "arrived"  # arrived -> cycle -> (late -> cycle ...) -> answered
    pinned: int = -1
    ends: int = -1  # the step its cycle ends at


class LateMeshHarness(SsbjHarness):
    """A stage with k = 2 partitions and ``late_master: 1h``, with the exact oracle."""

    def __init__(self, spark: SparkSession, root: Path, mode: str, **operator: Any) -> None:
        late = {"late_master": {"wait": "1h"}} | operator
        super().__init__(spark, root, mode, K, 1, "left", operator=late)
        self.tuples: list[Tuple] = []
        self.step_no = 0
        self.answers: dict[int, int] = {}  # id -> the master version that answered it

    def arrive(self, tuples: Any, at: Any = None) -> None:
        super().arrive(tuples, at)
        self.tuples += [Tuple(i, k) for i, k in tuples]

    def has_key(self, version: int, key: int) -> bool:
        rows = DeltaTable(self.master, version=version).to_pyarrow_table(columns=["mk"])
        return key in rows.column("mk").to_pylist()

    def step(self) -> None:
        """One run, and the oracle's step for it."""
        version = self.engine.snapshot(self.master).version
        arrived = [t for t in self.tuples if t.state == "arrived"]
        cycling = [t for t in self.tuples if t.state == "cycle"]
        returning = [t for t in self.tuples if t.state == "late" and t.pinned < version]
        self.runner.run_stage_step(self.config.stage("enrich"), f"run{self.step_no}")
        if not (arrived or cycling or returning):
            return
        self.step_no += 1
        for t in [*arrived, *returning]:
            t.state, t.pinned, t.ends = "cycle", version, self.step_no + K - 1
        for t in [t for t in self.tuples if t.state == "cycle" and t.ends == self.step_no]:
            if self.has_key(t.pinned, t.key):
                t.state = "answered"
                self.answers[t.id] = t.pinned
            else:
                t.state = "late"

    def oracle(self) -> list[tuple[Any, ...]]:
        con = duckdb.connect()
        answered = sorted(self.answers.items())
        masters = [
            _with_version(DeltaTable(self.master, version=v).to_pyarrow_table(), v)
            for v in sorted(set(self.answers.values()))
        ]
        if not masters:
            return []
        con.register("masters", pa.concat_tables(masters))
        con.register(
            "answers",
            pa.table(
                {
                    "id": [i for i, _ in answered],
                    "k": [next(t.key for t in self.tuples if t.id == i) for i, _ in answered],
                    "version": [v for _, v in answered],
                }
            ),
        )
        return con.execute(
            "SELECT a.id, a.k, m.mk, m.supplier, m.price, m.version FROM answers a "
            "JOIN masters m ON m.version = a.version AND m.mk = a.k"
        ).fetchall()

    def waiting_in_oracle(self) -> int:
        return sum(
            1 for t in self.tuples if t.state in ("late", "cycle") and t.id not in self.answers
        )

    def late_rows(self) -> list[int]:
        state = DeltaTable(self.paths_of("state")).to_pyarrow_table(columns=["_role", "s__id"])
        late = state.filter(pc.equal(state.column("_role"), LATE))
        return sorted(late.column("s__id").to_pylist())


def _with_version(rows: pa.Table, version: int) -> pa.Table:
    return rows.append_column("version", pa.array([version] * rows.num_rows, pa.int64()))


@pytest.mark.parametrize(
    "operator",
    [
        pytest.param({}, id="driver"),
        # The buckets in Spark tasks (the step's rows expected above the collect limit).
        pytest.param({"collect_rows": 1}, id="spark-tasks"),
    ],
)
def test_late_tuples_return_for_newer_versions_and_are_answered_once(
    spark: SparkSession, tmp_path: Path, operator: dict[str, Any]
) -> None:
    h = LateMeshHarness(spark, tmp_path, "meshjoin", **operator)
    h.load_master(MASTER, files=2)
    h.arrive([(0, 1), (1, 3), (2, 4), (3, 1)])
    h.step()  # all enter; nothing answered before their cycle ends
    h.update_master([(3, 0, 3.0)], [])  # key 3 lands while the cycle runs
    h.step()  # cycle ends: 0 and 3 answered, 1 and 4 met no row at v1: late
    assert h.late_rows() == [1, 2]
    h.step()  # v2 is newer: both return, for a cycle against v2
    h.arrive([(4, 4), (5, 3)])
    h.update_master([(4, 0, 4.0), (4, 1, 4.5)], [])
    h.step()  # 1 answered from v2; 2 (key 4, absent at v2) late again; 4, 5 enter at v3
    h.step()  # 2 returns for v3; 4 answered from v3, 5 from v3
    h.step()
    h.step()  # nothing new, nothing pending, no late row: no step
    assert h.waiting_in_oracle() == 0 and h.late_rows() == []
    assert_same_multiset(h.output(), h.oracle())
    assert sorted(h.answers.items()) == [(0, 1), (1, 2), (2, 3), (3, 1), (4, 3), (5, 3)]


def test_ssbj_with_its_cache_answers_each_late_tuple_once_from_a_version_with_its_key(
    spark: SparkSession, tmp_path: Path
) -> None:
    """With the cache a tuple may be answered (or found missing) at entry, so the exact
    path depends on what H_R holds; the contract does not: every tuple is answered once,
    from a master version no older than its arrival that has its key, and nothing waits
    once every key has landed and the stage drained."""
    h = LateMeshHarness(spark, tmp_path, "ssbj")
    h.load_master(MASTER, files=2)
    arrival: dict[int, int] = {}
    for batch, landing in [
        ([(0, 1), (1, 3), (2, 1), (3, 5)], [(3, 0, 3.0)]),
        ([(4, 3), (5, 6), (6, 1)], [(5, 0, 5.0), (5, 1, 5.5)]),
        ([(7, 5), (8, 6), (9, 1)], [(6, 0, 6.0)]),
        ([], []),
        ([], []),
    ]:
        version = h.engine.snapshot(h.master).version
        arrival |= {i: version for i, _ in batch}
        if batch:
            h.arrive(batch)
        h.runner.run_stage_step(h.config.stage("enrich"), f"run{len(arrival)}")
        if landing:
            h.update_master(landing, [])
    h.runner.run_stage_step(h.config.stage("enrich"), "last")
    h.drain()
    rows = h.output()
    assert sorted({r[0] for r in rows}) == list(range(10))
    for tuple_id, key, mk, supplier, price, version in rows:
        assert mk == key and version >= arrival[tuple_id]
        master = DeltaTable(h.master, version=version).to_pyarrow_table().to_pylist()
        assert {"mk": mk, "supplier": supplier, "price": price} in master
    per_tuple = {i: {r for r in rows if r[0] == i} for i in range(10)}
    for i, found in per_tuple.items():
        versions = {r[5] for r in found}
        assert len(versions) == 1, f"tuple {i} answered from versions {versions}"
        (version,) = versions
        master = DeltaTable(h.master, version=version).to_pyarrow_table().to_pylist()
        key = next(r[1] for r in found)
        assert len(found) == sum(1 for m in master if m["mk"] == key)  # all rows, once
    assert h.late_rows() == []
    assert "late_master_waiting" not in pipeline_status(h.config, h.store)["stages"]["enrich"]


def test_status_counts_waiting_tuples_and_leaving_ssbj_while_they_wait_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    h = LateMeshHarness(spark, tmp_path, "ssbj")
    h.load_master(MASTER, files=1)
    h.arrive([(0, 9), (1, 1)])
    h.step()
    h.step()
    stage = pipeline_status(h.config, h.store)["stages"]["enrich"]
    assert stage["late_master_waiting"] == 1
    assert stage["late_master_oldest_since"] is not None
    baseline = config_for(tmp_path, "baseline", 1, 1, "left")
    runner = PipelineRunner(PipelineHandles(baseline, spark, h.engine, h.store))
    with pytest.raises(ConfigError, match=r"1 tuple\(s\) wait for late master rows"):
        runner.driver(baseline.stage("enrich"))


def test_a_backfill_leaves_waiting_tuples_to_the_live_steps(
    spark: SparkSession, tmp_path: Path
) -> None:
    """As with the plain join: a backfill re-joins the interval without the tuples that
    wait for late master rows in SSBJ's state (a left join would otherwise emit them
    unmatched now and answered later); the live steps answer them, once."""
    h = LateMeshHarness(spark, tmp_path, "meshjoin")
    h.load_master(MASTER, files=1)
    h.arrive([(0, 1), (1, 9), (2, 2)])
    h.step()
    h.step()
    assert h.late_rows() == [1]
    start = BASE_TIME.replace(tzinfo=dt.UTC)
    rejoin_interval(h.runner, start, start + dt.timedelta(hours=1), "backfill")
    assert sorted(r[0] for r in h.output()) == [0, 0, 2]  # tuple 1 waits, not emitted
    h.update_master([(9, 0, 9.0)], [])
    h.step()
    h.step()
    assert h.late_rows() == [] and h.waiting_in_oracle() == 0
    assert sorted(r[0] for r in h.output() if r[0] == 1) == [1]


# ------------------------------------------------------------------ the rows' module


def _bucket(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema(
        [
            (ROLE, pa.string()),
            ("s__id", pa.int64()),
            (PINNED_VERSION, pa.int64()),
            (LATE_SINCE, pa.int64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def test_late_rows_return_for_a_newer_version_wait_or_expire() -> None:
    rule = LateRule(at_us=10_000, wait_us=1_000, left_join=True, master_version=5)
    table = _bucket(
        [
            {ROLE: LATE, "s__id": 1, PINNED_VERSION: 4, LATE_SINCE: 1},  # newer: returns
            {ROLE: LATE, "s__id": 2, PINNED_VERSION: 5, LATE_SINCE: 9_500},  # waits
            {ROLE: LATE, "s__id": 3, PINNED_VERSION: 5, LATE_SINCE: 9_000},  # wait over
            {ROLE: "pending", "s__id": 4, PINNED_VERSION: 3, LATE_SINCE: None},
        ]
    )
    rows = sort_late_rows(table, rule)
    assert rows.table.column("s__id").to_pylist() == [1, 4]
    assert rows.table.column(ROLE).to_pylist() == [RETURNING, "pending"]
    assert rows.table.column(PINNED_VERSION).to_pylist() == [None, 3]  # pinned anew
    assert rows.table.column(LATE_SINCE).to_pylist() == [1, None]  # its wait goes on
    assert rows.waiting.column("s__id").to_pylist() == [2]
    assert rows.expired.column("s__id").to_pylist() == [3]
    with pytest.raises(ValueError, match="expected >= 0"):
        LateRule(at_us=0, wait_us=-1, left_join=True, master_version=0)


@pytest.mark.parametrize("waits", [True, False])
def test_unmatched_tuples_wait_from_their_first_miss_or_expire(waits: bool) -> None:
    rule = LateRule(at_us=10_000, wait_us=1_000, left_join=False, master_version=7)
    source = _bucket(
        [
            {ROLE: "new", "s__id": 1, PINNED_VERSION: None, LATE_SINCE: None},
            {ROLE: "pending", "s__id": 2, PINNED_VERSION: 6, LATE_SINCE: None},
            {ROLE: RETURNING, "s__id": 3, PINNED_VERSION: None, LATE_SINCE: 8_000},
            {ROLE: "pending", "s__id": 4, PINNED_VERSION: 6, LATE_SINCE: 9_900},
        ]
    )
    output = [((1, 0), None, None), ((1, 1), ("m",), 6), ((2, 1), None, None)]
    output += [((3, 2), None, None), ((4, 3), None, None)]
    settled = settle_unmatched(output, source, rule if waits else replace(rule, wait_us=0))
    if waits:
        # New (0) and pending (2) tuples wait from now, the one that waited since 9,900 on;
        # the one waiting since 8,000 has waited its 1,000 µs: expired, dropped (inner).
        assert settled.waiting == [0, 2, 4]
        assert settled.since == [10_000, 10_000, 9_900]
        assert settled.pinned == [7, 6, 6]
        assert settled.expired_waiters == 1 and settled.emitted == []
    else:
        assert settled.waiting == [] and settled.expired_waiters == 2
