"""Two soak trials in CI on the embedded engine (the default): one local whose first
interval goes through the continuous mode (``enrich stream`` killed in a micro-batch and
started again), one with its state in PostgreSQL and its tables and landing zone on an
object store (a bucket of the session's SeaweedFS server); the full run, which gives half
its trials to the native engine and a quarter each to the object store and the continuous
mode, is a command (a native trial takes 2-4 times as long: BENCHMARKS.md, section 6).

    .venv/bin/python -m tests.soak.run_soak --trials 100 --seed 1 --out soak.md

Each trial delivers bad files, re-deliveries and re-sent ids, commits master changes
between commands (append, MERGE, overwrite) and runs ``maintain``, SIGKILLs the worker at
a random crash point, reruns it, and checks bronze, the quarantines, silver, gold and the
late table of an equi and a theta stage against the DuckDB oracle, by recorded master
version (see :mod:`tests.soak.trial`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.object_store_server import S3Server
from tests.soak.run_soak import run_soak
from tests.soak.trial import TABLES, stream_attempts

pytestmark = pytest.mark.slow


def test_soak_trials_lose_and_duplicate_nothing(
    tmp_path: Path, postgres_url: str, s3_server: S3Server
) -> None:
    # Seed 24: SSBJ waiting for late master rows in its state, on local disk, its first
    # interval delivered while `enrich stream` runs from an empty warehouse, the stream
    # killed after its first SSBJ step's output commit and started again (the default
    # stream_every puts one of a soak this short in the continuous mode); seed 25: the
    # plain join waiting 2h for them in its late table, its state in PostgreSQL, its tables
    # and landing zone on the object store, killed before its second Delta commit of a run
    # lands (the data files PUT, the commit file not). Both on the embedded engine, both
    # re-send ids and see every kind of master commit and a maintain between their commands.
    result = run_soak(
        tmp_path / "soak",
        trials=2,
        seed=24,
        state_stores=(None, postgres_url),
        object_store_every=2,
        s3_server=s3_server,
    )
    print(result.summary())
    assert result.ok, result.summary()
    assert result.kills == 2, result.summary()
    assert {c.engine for c in result.checks} == {"embedded"}
    assert {c.state_store for c in result.checks} == {"sqlite", "postgres"}
    assert result.rows_checked > 500
    assert result.lost == 0 and result.duplicated == 0

    local, stored = result.plans
    assert (local.storage, local.bucket) == ("local", None)
    assert stored.storage == "s3" and stored.bucket is not None
    assert stored.crash.point.startswith("delta.before_commit")
    # Every armed point was hit (in the stream trial, by the stream's process).
    armed = Counter(p.crash.point.split(":")[0] for p in result.plans)
    assert result.hit_points == armed, result.summary()

    # The stream trial: its stream command is the one killed; the first start died at the
    # armed point, the second ran until idle; the files of its interval were loaded by the
    # stream's micro-batches (check_trial reports any a scheduled run loaded instead).
    assert (local.stream, stored.stream) == (True, False)
    assert local.commands[local.crash.command].kind == "stream"
    starts = stream_attempts(Path(local.root))
    assert [(a["crash"], a["exit"]) for a in starts] == [(local.crash.point, -9), (None, 0)]
    # Its interval landed while the first start ran (the armed step needs its tuples).
    assert starts[0]["live"] == list(local.streamed), starts
    assert starts[1]["micro_batches"] > 0, starts
    (streamed,) = [c for c in result.checks if c.stream]
    assert streamed.streamed_files >= len(local.streamed), result.summary()
    # The trial's tables are in its bucket (the oracle read them there, and found none on
    # local disk), and so are the files it was delivered.
    client = s3_server.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=stored.bucket, Prefix="wh/")
    logs = {
        str(o["Key"]).removeprefix("wh/").partition("/_delta_log/")[0]
        for page in pages
        for o in page.get("Contents", [])
        if "/_delta_log/" in o["Key"]
    }
    assert set(TABLES) <= logs, sorted(logs)
    (checked,) = [c for c in result.checks if c.storage == "s3"]
    assert checked.tables_on_store == tuple(sorted(logs))
    assert client.list_objects_v2(Bucket=stored.bucket, Prefix="landing/")["KeyCount"] > 0
    assert not any((Path(stored.root) / name).exists() for name in ("wh", "landing"))
