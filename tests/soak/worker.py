"""The soak worker: runs the commands of every trial under a folder, in one Spark session.

    python -m tests.soak.worker TRIALS_DIR [SHARD/SHARDS]

Each trial folder holds ``plan.json``; ``progress`` holds how many of its commands
completed. The worker resumes each trial at its first unfinished command, so after a
SIGKILL the harness simply starts it again. Before running a trial's armed command for
the first time it writes ``crash_armed`` and sets ``ENRICH_CRASH_AT``: a restarted worker
finds the marker and reruns that command without a crash. Commands run through
``jobs.enrich.main`` exactly as the CLI runs them (lease, run ledger, exit codes), sharing
this process's Spark session so that only a kill costs a JVM start.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from common.faults import CRASH_ENV_VAR, reset_crash_counts
from tests.soak.trial import ALLOWED_EXIT, TrialPlan, deliver

logger = logging.getLogger("soak.worker")


def run_trials(trials_dir: Path, shard: int = 0, shards: int = 1) -> int:
    from jobs import enrich
    from tests.helpers import TEST_SPARK_CONF
    from warehouse.spark import SparkSettings, build_session

    build_session(
        SparkSettings(
            app_name="soak",
            master="local[2]",
            conf={**TEST_SPARK_CONF, "spark.driver.memory": "2g"},
        )
    )
    roots = sorted(p for p in trials_dir.iterdir() if (p / "plan.json").exists())
    for root in roots[shard::shards]:
        plan = TrialPlan.load(root)
        progress = root / "progress"
        done = int(progress.read_text()) if progress.exists() else 0
        for index in range(done, len(plan.commands)):
            command = plan.commands[index]
            armed = index == plan.crash.command and not (root / "crash_armed").exists()
            if armed:
                (root / "crash_armed").write_text(plan.crash.point)
                os.environ[CRASH_ENV_VAR] = plan.crash.point
                reset_crash_counts()
            try:
                if command.kind == "deliver":
                    deliver(root, command.interval)
                    code = 0
                else:
                    code = enrich.main(["--config", str(root / "config.yaml"), *command.args])
            finally:
                os.environ.pop(CRASH_ENV_VAR, None)
            if armed:
                (root / "crash_missed").write_text(plan.crash.point)
            if command.kind != "deliver" and code not in ALLOWED_EXIT[command.kind]:
                print(
                    f"trial {root.name}: command {index} {command.args} exited {code}",
                    file=sys.stderr,
                )
                return 1
            progress.write_text(str(index + 1))
    return 0


if __name__ == "__main__":
    shard, _, shards = (sys.argv[2] if len(sys.argv) > 2 else "0/1").partition("/")
    sys.exit(run_trials(Path(sys.argv[1]), int(shard), int(shards)))
