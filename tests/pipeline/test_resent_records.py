"""A producer that re-sends records in a new file: each id enriched once, through the
runner (landing ingest, then the stage), against DuckDB over the distinct records."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.helpers import assert_same_multiset
from tests.pipeline.ssbj_harness import SsbjHarness

MASTER = [(k, s, float(10 * k + s)) for k in range(7) for s in range(1 + k % 3)]


def deliver(h: SsbjHarness, name: str, ids: range) -> None:
    landing = Path(h.config.streams["s"].landing)
    landing.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps(
            {
                "id": i,
                "k": i % 9,
                "ts": (dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i)).isoformat(),
            }
        )
        for i in ids
    ]
    (landing / name).write_text("\n".join(lines) + "\n")


def run(h: SsbjHarness, run_id: str) -> None:
    h.store.start_run(run_id, "run")
    h.runner.ingest(run_id)
    h.runner.run_stage_step(h.config.stage("enrich"), run_id)


@pytest.mark.parametrize(("mode", "how"), [("baseline", "left"), ("ssbj", "inner")])
def test_records_re_sent_in_later_files_are_enriched_once(
    spark: SparkSession, tmp_path: Path, mode: str, how: str
) -> None:
    h = SsbjHarness(spark, tmp_path, mode, 2, 1, how)
    h.load_master(MASTER, files=2)
    deliver(h, "a.json", range(0, 100))
    run(h, "r1")
    # A producer retry re-sends 50-99 with 100-149; a second retry re-sends 120-129 alone.
    deliver(h, "b.json", range(50, 150))
    deliver(h, "c.json", range(120, 130))
    run(h, "r2")
    if mode == "ssbj":
        h.drain()
    version = h.engine.snapshot(h.master).version
    h.batches = [([(i, i % 9) for i in range(150)], version)]
    assert_same_multiset(h.output(), h.oracle(how))
    assert sum(row.records_resent or 0 for row in h.store.landing_files("s")) == 60
