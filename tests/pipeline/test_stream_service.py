"""The continuous mode (``enrich stream``) against DuckDB: files land while the stream runs,
every tuple is answered and published once without a scheduled run, and a stream killed
in a micro-batch resumes where it stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from common.errors import ConfigError
from common.faults import CRASH_ENV_VAR
from pipeline.config import parse_config
from pipeline.stream_service import (
    STREAM_MEMORY_BYTES,
    StreamService,
    StreamSettings,
    StreamStats,
    resolve_trigger,
    stream_needs,
    with_stream_memory,
    with_stream_session,
)
from tests.conftest import REPO_ROOT
from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import BASE_TIME, SsbjHarness
from tests.pipeline.test_freshness import _config as freshness_config

MASTER = [(k, s, float(10 * k + s)) for k in range(1, 7) for s in range(1 + k % 3)]
BATCHES = [
    [(0, 1), (1, 2), (2, 2), (3, 99)],
    [(4, 3), (5, 1), (6, 6)],
    [(7, 4), (8, 5), (9, 1), (10, 77)],
]
COLUMNS = ["id", "k", "mk", "supplier", "price", "_version_m"]


def land(
    h: SsbjHarness, name: str, tuples: list[tuple[int, int]], version: int | None = None
) -> None:
    """One JSON file in the stream's landing zone, placed atomically as a producer must
    (temporary name, then rename); with ``version``, recorded in the harness as answered
    at that master version (for its oracle)."""
    if version is not None:
        h.batches.append((tuples, version))
    landing = Path(h.config.streams["s"].landing)
    landing.mkdir(parents=True, exist_ok=True)
    staging = landing / f"_{name}.tmp"
    lines = [
        json.dumps({"id": i, "k": k, "ts": (BASE_TIME.replace(second=i % 60)).isoformat()})
        for i, k in tuples
    ]
    staging.write_text("\n".join(lines) + "\n")
    os.replace(staging, landing / name)


def in_thread(
    work: Callable[[], StreamStats],
) -> tuple[threading.Thread, list[StreamStats | BaseException]]:
    """``work`` started in a thread of its own; the list receives its result or error."""
    outcome: list[StreamStats | BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            outcome.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def published(h: SsbjHarness) -> list[tuple[object, ...]]:
    table = DeltaTable(h.layout.published("out")).to_pyarrow_table(columns=COLUMNS)
    return [tuple(r.values()) for r in table.to_pylist()]


def test_the_trigger_follows_from_every_stage_s_stream_bound() -> None:
    ssbj = freshness_config(
        {"operator": {"mode": "auto", "partitions": 4}, "freshness": {"stream_within": "12m"}}
    )
    plain = dict(ssbj["stages"][0], name="p", output="o2", operator={"mode": "baseline"})
    plain["freshness"] = {"complete_within": "1 interval", "stream_within": "90s"}
    config = parse_config(ssbj)
    # auto may run SSBJ: it needs its R-cycle of k = 4 steps, plus one trigger.
    assert [(n.stage, n.triggers) for n in stream_needs(config)] == [("e", 5)]
    assert resolve_trigger(config, None) == timedelta(seconds=144)
    both = parse_config(ssbj | {"stages": [*ssbj["stages"], plain]})
    assert [(n.stage, n.triggers) for n in stream_needs(both)] == [("e", 5), ("p", 2)]
    assert resolve_trigger(both, None) == timedelta(seconds=45)
    assert resolve_trigger(both, timedelta(seconds=20)) == timedelta(seconds=20)
    with pytest.raises(ConfigError) as raised:
        resolve_trigger(both, timedelta(minutes=1))
    assert "--trigger" in str(raised.value)
    assert "stage p" in str(raised.value)


def _left_ssbj_stage(spark: SparkSession, tmp_path: Path) -> tuple[SsbjHarness, int]:
    """A left SSBJ stage over k = 2 partitions, its master loaded (in two files): the
    harness and the master's version."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left")
    h.load_master(MASTER, files=2)
    return h, h.engine.snapshot(h.master).version


def test_the_stream_answers_and_publishes_every_tuple_once_as_files_land(
    spark: SparkSession, tmp_path: Path
) -> None:
    h, version = _left_ssbj_stage(spark, tmp_path)
    service = StreamService(h.context, StreamSettings(trigger_seconds=0.5, idle_stop_seconds=5))
    thread, outcome = in_thread(service.run)
    for index, batch in enumerate(BATCHES):
        land(h, f"b{index}.json", batch, version)
        time.sleep(1.5)
    thread.join(timeout=180)
    assert not thread.is_alive(), "the stream did not stop once idle"
    stats = outcome[0]
    assert isinstance(stats, StreamStats), stats
    assert stats.micro_batches >= len(BATCHES)
    # No scheduled run, no drain: the stream's own steps answered and published every tuple.
    assert h.operator().pending_rows() == 0
    assert_same_multiset(published(h), h.oracle("left"))
    assert_same_multiset(h.output(), h.oracle("left"))
    loaded = [f for f in h.store.landing_files("s") if f.status == "loaded"]
    assert len(loaded) == len(BATCHES)


def _config_file(h: SsbjHarness, tmp_path: Path) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(h.config.model_dump(mode="json", exclude_none=True)))
    return path


@pytest.mark.slow
def test_a_stream_killed_in_a_micro_batch_resumes_where_it_stopped(
    spark: SparkSession, tmp_path: Path
) -> None:
    h, version = _left_ssbj_stage(spark, tmp_path)
    for index, batch in enumerate(BATCHES):
        land(h, f"b{index}.json", batch, version)
    config = _config_file(h, tmp_path)
    command = [sys.executable, "-m", "jobs.enrich", "--config", str(config), "stream"]
    options = ["--trigger", "1s", "--idle-stop", "5"]
    # Killed after the second SSBJ step's output commit, before its state commit.
    killed = subprocess.run(
        [*command, *options],
        cwd=REPO_ROOT,
        env={**os.environ, CRASH_ENV_VAR: "ssbj.after_output:2"},
        capture_output=True,
        timeout=600,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr.decode()[-3000:]
    resumed = subprocess.run(
        [*command, *options], cwd=REPO_ROOT, capture_output=True, timeout=600, check=False
    )
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert b"stream stopped" in resumed.stdout
    assert h.operator().pending_rows() == 0
    assert_same_multiset(published(h), h.oracle("left"))


def test_the_continuous_mode_holds_a_memory_budget_unless_a_stage_sets_one() -> None:
    raw = freshness_config({"operator": {"mode": "ssbj", "partitions": 4}})
    own = dict(raw["stages"][0], name="own", output="o2")
    own["operator"] = {"mode": "ssbj", "partitions": 4, "memory_bytes": 5_000_000}
    config = parse_config(raw | {"stages": [*raw["stages"], own]})
    streamed = with_stream_memory(config)
    budgets = {s.name: s.operator.memory_bytes for s in streamed.stages}  # type: ignore[union-attr]
    assert budgets == {"e": STREAM_MEMORY_BYTES, "own": 5_000_000}
    # The scheduled config is untouched.
    assert config.stages[0].operator.memory_bytes is None  # type: ignore[union-attr]


def test_the_continuous_mode_s_session_idles_cheaply_unless_the_config_says_otherwise() -> None:
    raw = freshness_config({"operator": {"mode": "ssbj", "partitions": 4}})
    config = parse_config(raw)
    conf = with_stream_session(config, None).spark.conf
    assert conf["spark.executor.heartbeatInterval"] == "60s"
    assert conf["spark.driver.extraJavaOptions"] == "-XX:+UseSerialGC"
    assert {k: conf[k] for k in config.spark.conf} == config.spark.conf
    assert "spark.executor.heartbeatInterval" not in config.spark.conf  # the scheduled config
    # The config's own settings win; its own collector is kept, its other options too.
    raw.setdefault("spark", {}).setdefault("conf", {}).update(
        {
            "spark.executor.heartbeatInterval": "20s",
            "spark.driver.extraJavaOptions": "-Dx=1",
        }
    )
    own = with_stream_session(parse_config(raw), None).spark.conf
    assert own["spark.executor.heartbeatInterval"] == "20s"
    assert own["spark.driver.extraJavaOptions"] == "-XX:+UseSerialGC -Dx=1"
    raw["spark"]["conf"]["spark.driver.extraJavaOptions"] = "-XX:+UseParallelGC"
    own = with_stream_session(parse_config(raw), None).spark.conf
    assert own["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    # A shorter network timeout than the minute would make Spark refuse to start.
    raw["spark"]["conf"] = {"spark.network.timeout": "30s"}
    own = with_stream_session(parse_config(raw), None).spark.conf
    assert "spark.executor.heartbeatInterval" not in own
    # Over Spark Connect the JVM is the server's: nothing to set.
    assert with_stream_session(config, "sc://127.0.0.1:15002") == config


def _run_until_idle(h: SsbjHarness) -> StreamStats:
    stats = StreamService(h.context, StreamSettings(trigger_seconds=0.5, idle_stop_seconds=3)).run()
    assert isinstance(stats, StreamStats)
    return stats


def test_tuples_waiting_for_late_master_rows_let_the_stream_go_idle_until_the_master_moves(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A late tuple needs a step only when the master moves (or its wait ends): an idle
    stream must not step for it every tick, and must step once the master has moved."""
    h = SsbjHarness(spark, tmp_path, "ssbj", 2, 1, "left", operator={"late_master": {"wait": "1h"}})
    h.load_master(MASTER, files=2)
    land(h, "b0.json", [(0, 1), (1, 99)])
    thread, done = in_thread(lambda: _run_until_idle(h))
    thread.join(timeout=120)
    assert not thread.is_alive(), "a late tuple kept the stream stepping: it never went idle"
    assert isinstance(done[0], StreamStats), done[0]
    state = h.store.operator_state("enrich")
    assert state is not None and int(state["late_rows"]) == 1
    driver = h.runner.driver(h.config.stage("enrich"))
    assert not driver.work_due()
    assert sorted((r[0], r[2]) for r in published(h)) == [(0, 1), (0, 1)]

    h.update_master([(99, 0, 9.9)], [])
    assert driver.work_due()  # the master moved: the late tuple returns at the next step
    _run_until_idle(h)
    answers = sorted((r[0], r[2], r[4]) for r in published(h))
    assert answers == [(0, 1, 10.0), (0, 1, 11.0), (1, 99, 9.9)]
    assert not h.runner.driver(h.config.stage("enrich")).work_due()
