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
saying why; the worker goes on with the next trial and exits 1 at the end. A ``stream``
command (:func:`run_stream`) runs ``enrich stream`` as a process of its own, as a
deployment does, and delivers its intervals while it runs: that process, not the worker,
is the one armed to be killed, and the worker starts it again to finish. Other commands run through
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
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from common.faults import CRASH_ENV_VAR, reset_crash_counts
from tests.soak.trial import (
    ALLOWED_EXIT,
    STREAM_ARMED_MAX_SECONDS,
    STREAM_FINAL_MAX_SECONDS,
    STREAM_LOG,
    Command,
    TrialPlan,
    apply_master_change,
    deliver,
    record_master_versions,
    stream_attempts,
)

logger = logging.getLogger("soak.worker")

REPO_ROOT = Path(__file__).resolve().parents[2]
# Seconds between two deliveries to a running stream: two triggers, so that each interval
# lands in a micro-batch of its own, and less than its idle stop, so that it waits for the
# next one.
STREAM_DELIVERY_GAP = 2.0
# How long a start may take to finish its first micro-batch before the worker delivers
# anyway (a JVM start on a busy machine takes 10-30 s).
STREAM_START_SECONDS = 180.0


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
            if command.kind != "stream":  # the stream's process is armed, not this one
                os.environ[CRASH_ENV_VAR] = plan.crash.point
                reset_crash_counts()
        started = time.monotonic()
        hit = False
        try:
            if command.kind == "stream":
                code, hit = run_stream(plan, index, plan.crash.point if armed else None)
            elif command.kind == "deliver":
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
        if armed and not hit:
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


def run_stream(plan: TrialPlan, index: int, crash: str | None) -> tuple[int, bool]:
    """Run the trial's ``stream`` command ``index``: its intervals delivered while
    ``enrich stream`` runs, that process killed at ``crash`` (None: not armed), then started
    again to finish. Returns the last start's exit code and whether the armed one was killed.

    The first start is armed. Once it has finished a micro-batch (its clock query has
    committed one more batch to its checkpoint) the worker delivers the intervals one by
    one, ``STREAM_DELIVERY_GAP`` apart; if the process has died by then (killed, say, in a
    micro-batch of work left by the scheduled runs) the rest land while no stream runs, as
    they would in a deployment. After the first start ends, a second one, unarmed, runs until
    idle (or ``STREAM_FINAL_MAX_SECONDS``): its first micro-batch ingests whatever landed
    after the last one of the first (that start may have gone idle before a last file's
    micro-batch), so every streamed file is loaded by the stream, which the oracle checks.
    A worker restarted in the middle runs the unarmed start only (``crash_armed`` is there);
    deliveries are idempotent."""
    command = plan.commands[index]
    root = Path(plan.root)
    hit = False
    live: list[int] = []
    if crash is not None:  # an exit other than 0 or the kill raises
        code, live = _stream_attempt(plan, command, crash, STREAM_ARMED_MAX_SECONDS)
        hit = code == -signal.SIGKILL
    for interval in command.intervals:  # what the first start did not see land, if any
        deliver(plan, interval)
    code, _ = _stream_attempt(plan, command, None, STREAM_FINAL_MAX_SECONDS, deliveries=False)
    logger.info("trial %s: stream delivered %s to a running stream", root.name, live)
    return code, hit


def _stream_attempt(
    plan: TrialPlan,
    command: Command,
    crash: str | None,
    max_seconds: int,
    deliveries: bool = True,
) -> tuple[int, list[int]]:
    """One start of ``enrich stream``: its exit code, and the intervals delivered while it
    ran (with ``deliveries``). Its output goes to ``stream-<n>.log`` in the trial folder."""
    root = Path(plan.root)
    commits = Path(plan.warehouse) / "_stream" / "_clock" / "commits"
    before = _batches(commits)
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV_VAR}
    if crash is not None:
        env[CRASH_ENV_VAR] = crash
    attempt = len(stream_attempts(root)) + 1
    log = root / f"stream-{attempt}.log"
    started = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                *("-m", "jobs.enrich", "--config", str(root / "config.yaml")),
                *command.stream_args(max_seconds),
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        live: list[int] = []
        try:
            if deliveries:
                while (
                    process.poll() is None
                    and _batches(commits) <= before
                    and time.monotonic() - started < STREAM_START_SECONDS
                ):
                    time.sleep(0.2)
                for n, interval in enumerate(command.intervals):
                    if n and process.poll() is None:
                        time.sleep(STREAM_DELIVERY_GAP)
                    running = process.poll() is None
                    deliver(plan, interval)
                    if running:
                        live.append(interval)
            # Bounded by its --max-seconds; the margin is for the JVM's start and stop.
            code = process.wait(timeout=max_seconds + STREAM_START_SECONDS + 120)
        finally:
            if process.poll() is None:
                process.kill()  # the worker is failing: leave no stream behind
                process.wait()
    stopped = re.search(rb"stream stopped: (\d+) micro-batch", log.read_bytes())
    record = {
        "attempt": attempt,
        "crash": crash,
        "exit": code,
        "seconds": round(time.monotonic() - started, 1),
        "live": live,
        "batches": _batches(commits) - before,
        "micro_batches": int(stopped.group(1)) if stopped else None,
    }
    with (root / STREAM_LOG).open("a") as records:
        records.write(json.dumps(record) + "\n")
    if code not in (*ALLOWED_EXIT["stream"], -signal.SIGKILL):
        tail = log.read_bytes()[-3000:].decode(errors="replace")
        raise RuntimeError(f"enrich stream exited {code}; the end of {log}:\n{tail}")
    return code, live


def _batches(commits: Path) -> int:
    """Micro-batches the stream's clock query has committed (its checkpoint's ``commits``
    folder holds one file per batch, and hidden checksum files)."""
    if not commits.is_dir():
        return 0
    return sum(1 for p in commits.iterdir() if not p.name.startswith("."))


if __name__ == "__main__":
    shard, _, shards = (sys.argv[2] if len(sys.argv) > 2 else "0/1").partition("/")
    sys.exit(run_trials(Path(sys.argv[1]), int(shard), int(shards)))
