"""Fault-injection soak of the whole pipeline; prints what it killed and what it checked.

    .venv/bin/python -m tests.soak.run_soak --trials 100 --seed 1 [--dir var/soak] [--resume]

Makes ``--trials`` seeded trials (see :mod:`tests.soak.trial`), runs them all through one
worker process (:mod:`tests.soak.worker`), starting it again after every SIGKILL, then
checks every trial's bronze, ingest quarantine, silver and gold against the DuckDB oracle
as multisets. Exits 1 if any row was lost or duplicated, or a command failed.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.soak.trial import TrialCheck, TrialPlan, check_trial, make_trial

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SoakResult:
    trials: int
    kills: int = 0
    armed_points: Counter[str] = field(default_factory=Counter)
    hit_points: Counter[str] = field(default_factory=Counter)
    checks: list[TrialCheck] = field(default_factory=list)
    worker_failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows_checked(self) -> int:
        return sum(c.rows_checked for c in self.checks)

    @property
    def lost(self) -> int:
        return sum(c.lost for c in self.checks)

    @property
    def duplicated(self) -> int:
        return sum(c.duplicated for c in self.checks)

    @property
    def ok(self) -> bool:
        return not self.worker_failures and not any(c.problems for c in self.checks)

    def summary(self) -> str:
        lines = [
            f"trials: {self.trials}, worker kills (SIGKILL) hit: {self.kills}, "
            f"armed points not reached: {self.trials - self.kills}",
            f"rows checked: {self.rows_checked}, lost: {self.lost}, duplicated: "
            f"{self.duplicated}, failed commands: {len(self.worker_failures)}, "
            f"{self.seconds:.0f}s",
            "kill points hit: "
            + ", ".join(f"{p} x{n}" for p, n in sorted(self.hit_points.items())),
        ]
        lines += [f"  seed {c.seed}: {p}" for c in self.checks for p in c.problems]
        lines += [f"  {f}" for f in self.worker_failures]
        return "\n".join(lines)


def run_soak(
    directory: Path,
    trials: int,
    seed: int,
    state_stores: Sequence[str | None] = (None,),
    worker_timeout: float = 3 * 3600,
    resume: bool = False,
    workers: int = 1,
) -> SoakResult:
    """Run ``trials`` trials; trial n keeps its state in ``state_stores[n % len]``.

    With ``resume`` the trials already under ``directory`` are continued where they stopped
    (the worker resumes each at its first unfinished command) instead of made anew.
    ``workers`` worker processes share the trials (trial i goes to worker i % workers).
    """
    started = time.monotonic()
    if resume and directory.exists():
        plans = [TrialPlan.load(p) for p in sorted(directory.iterdir()) if p.name.startswith("t")]
    else:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        plans = [
            make_trial(
                directory / f"t{seed + n:05d}",
                seed + n,
                state_store=state_stores[n % len(state_stores)],
            )
            for n in range(trials)
        ]
    trials = len(plans)
    result = SoakResult(trials)
    for plan in plans:
        result.armed_points[plan.crash.point] += 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        failures = pool.map(
            lambda shard: _run_worker(directory, shard, workers, trials, worker_timeout),
            range(workers),
        )
        result.worker_failures += [f for f in failures if f]
    for plan in plans:
        root = Path(plan.root)
        if (root / "crash_armed").exists() and not (root / "crash_missed").exists():
            result.hit_points[plan.crash.point.split(":")[0]] += 1
        if (root / "progress").exists() and int((root / "progress").read_text()) == len(
            TrialPlan.load(root).commands
        ):
            result.checks.append(check_trial(root))
        else:
            result.worker_failures.append(f"trial {root.name} did not finish")
    # Counted from the trials' markers, so a resumed soak counts the kills of earlier runs.
    result.kills = sum(result.hit_points.values())
    result.seconds = time.monotonic() - started
    return result


def _run_worker(
    directory: Path, shard: int, shards: int, trials: int, timeout: float
) -> str | None:
    """Run one worker over its shard of the trials, again after every SIGKILL."""
    for _ in range(trials + 1):
        worker = subprocess.run(
            [sys.executable, "-m", "tests.soak.worker", str(directory), f"{shard}/{shards}"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if worker.returncode == -signal.SIGKILL:
            continue
        if worker.returncode != 0:
            return f"worker {shard}/{shards} exited {worker.returncode}: {worker.stderr[-3000:]}"
        return None
    return f"worker {shard}/{shards} was killed more often than there are trials"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=REPO_ROOT / "var" / "soak")
    parser.add_argument(
        "--resume", action="store_true", help="continue the trials already under --dir"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    args = parser.parse_args(argv)
    result = run_soak(args.dir, args.trials, args.seed, resume=args.resume, workers=args.workers)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
