"""The soak worker: runs the commands of every trial under a folder, in one Spark session.

    python -m tests.soak.worker TRIALS_DIR [SHARD/SHARDS]

Each trial folder holds ``plan.json``; ``progress`` holds how many of its commands
completed. Before every command the worker logs the masters' versions in force (and keeps
their rows, :func:`tests.soak.trial.record_master_versions`); ``master`` commands commit a
planned master change with deltalake, between the pipeline's commands. The worker
resumes each trial at its first unfinished command, so after a SIGKILL the harness simply
starts it again. Before running a trial's armed command for
the first time it writes ``crash_armed`` and sets ``ENRICH_CRASH_AT``: a restarted worker
finds the marker and reruns that command without a crash. A command that fails (an exit
code a correct run does not give, or an exception) ends its trial with a ``failed`` file
saying why; the worker goes on with the next trial and exits 1 at the end. Commands run through
``jobs.enrich.main`` exactly as the CLI runs them (lease, run ledger, exit codes), sharing
this process's Spark session so that only a kill costs a JVM start. When any of its
trials is on the object store, that session starts with S3A's jars and the store the
``AWS_*`` environment names (the harness passes its server's); each command points it at
the store again, as the CLI does.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from common.faults import CRASH_ENV_VAR, reset_crash_counts
from tests.soak.trial import (
    ALLOWED_EXIT,
    TrialPlan,
    apply_master_change,
    deliver,
    record_master_versions,
)

logger = logging.getLogger("soak.worker")


def run_trials(trials_dir: Path, shard: int = 0, shards: int = 1) -> int:
    from jobs import enrich
    from tests.helpers import TEST_SPARK_CONF
    from warehouse.object_store import ObjectStore
    from warehouse.spark import SparkSettings, build_session

    roots = sorted(p for p in trials_dir.iterdir() if (p / "plan.json").exists())[shard::shards]
    # S3A's jars go on the class path only when the session starts: a later command whose
    # warehouse is on the store could not add them to this shared session.
    on_store = any(TrialPlan.load(root).bucket is not None for root in roots)
    build_session(
        SparkSettings(
            app_name="soak",
            master="local[2]",
            conf={**TEST_SPARK_CONF, "spark.driver.memory": "2g"},
            object_store=ObjectStore.from_environment() if on_store else None,
        )
    )
    failed = 0
    for root in roots:
        if (root / "failed").exists():
            failed += 1
            continue
        problem = _run_trial(enrich.main, root)
        if problem:
            (root / "failed").write_text(problem)
            print(f"trial {root.name}: {problem}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _run_trial(enrich_main: Callable[[list[str]], int], root: Path) -> str | None:
    """Run a trial's commands from its first unfinished one; a problem, or None."""
    plan = TrialPlan.load(root)
    progress = root / "progress"
    done = int(progress.read_text()) if progress.exists() else 0
    for index in range(done, len(plan.commands)):
        command = plan.commands[index]
        record_master_versions(plan, index)
        armed = index == plan.crash.command and not (root / "crash_armed").exists()
        if armed:
            (root / "crash_armed").write_text(plan.crash.point)
            os.environ[CRASH_ENV_VAR] = plan.crash.point
            reset_crash_counts()
        started = time.monotonic()
        try:
            if command.kind == "deliver":
                deliver(plan, command.interval)
                code = 0
            elif command.kind == "master":
                apply_master_change(plan, index, json.loads(command.args[0]))
                code = 0
            else:
                code = enrich_main(["--config", str(root / "config.yaml"), *command.args])
        except Exception:  # noqa: BLE001
            # A command that raises is the pipeline's failure, not the soak's: the trial
            # records it and the soak goes on, so one finding does not hide the others.
            return f"command {index} {command.args[:1]} raised: {traceback.format_exc()[-4000:]}"
        finally:
            os.environ.pop(CRASH_ENV_VAR, None)
        if armed:
            (root / "crash_missed").write_text(plan.crash.point)
        if command.kind in ALLOWED_EXIT and code not in ALLOWED_EXIT[command.kind]:
            return f"command {index} {command.args} exited {code}"
        # Seconds spent in completed commands (a killed attempt's time is not counted).
        spent = root / "seconds"
        before = float(spent.read_text()) if spent.exists() else 0.0
        spent.write_text(f"{before + time.monotonic() - started:.3f}")
        with (root / "timings").open("a") as timings:
            timings.write(f"{index} {command.kind} {time.monotonic() - started:.2f}\n")
        progress.write_text(str(index + 1))
    return None


if __name__ == "__main__":
    shard, _, shards = (sys.argv[2] if len(sys.argv) > 2 else "0/1").partition("/")
    sys.exit(run_trials(Path(sys.argv[1]), int(shard), int(shards)))
