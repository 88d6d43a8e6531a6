"""Fault-injection soak of the whole pipeline; prints what it killed and what it checked.

    .venv/bin/python -m tests.soak.run_soak --trials 100 --seed 1 [--out FILE]
        [--postgres-every 3] [--dir var/soak] [--resume]

Makes ``--trials`` seeded trials (see :mod:`tests.soak.trial`), runs them all through one
worker process (:mod:`tests.soak.worker`), starting it again after every SIGKILL, then
checks every trial's bronze, quarantines, silver, gold and late table against the DuckDB
oracle as multisets, by recorded master version. Every ``--postgres-every``-th trial keeps
its state store in PostgreSQL (a throwaway server on loopback, a database per trial).
Prints the result, writes it as markdown to ``--out``, and exits 1 if any row was lost or
duplicated, a tuple was answered from a version the contract does not allow, or a command
failed.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.revision import has_uncommitted_changes, short_commit
from tests.soak.trial import TrialCheck, TrialPlan, check_trial, make_trial

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SoakResult:
    trials: int
    seed: int = 0
    kills: int = 0
    armed_points: Counter[str] = field(default_factory=Counter)
    hit_points: Counter[str] = field(default_factory=Counter)
    checks: list[TrialCheck] = field(default_factory=list)
    worker_failures: list[str] = field(default_factory=list)
    trial_seconds: list[float] = field(default_factory=list)
    plans: list[TrialPlan] = field(default_factory=list)
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

    def configurations(self) -> Counter[str]:
        """Trials (checked or failed) per engine x state store x equi mode."""
        return Counter(
            f"{p.engine} / {p.state_store} / {p.mode}"
            + (f"+late {p.late_wait}" if p.late_wait else "")
            for p in self.plans
        )

    def engines(self) -> Counter[str]:
        return Counter(p.engine for p in self.plans)

    def state_stores(self) -> Counter[str]:
        return Counter(p.state_store for p in self.plans)

    def summary(self) -> str:
        lines = [
            f"trials: {self.trials}, worker kills (SIGKILL) hit: {self.kills}, "
            f"armed points not reached: {self.trials - self.kills}",
            f"rows checked: {self.rows_checked}, lost: {self.lost}, duplicated: "
            f"{self.duplicated}, failed commands: {len(self.worker_failures)}, "
            f"{self.seconds:.0f}s",
            "kill points hit: "
            + ", ".join(f"{p} x{n}" for p, n in sorted(self.hit_points.items())),
            "engines: " + _counts(self.engines()),
            "state stores: " + _counts(self.state_stores()),
        ]
        lines += [f"  seed {c.seed}: {p}" for c in self.checks for p in c.problems]
        lines += [f"  {f}" for f in self.worker_failures]
        return "\n".join(lines)

    def markdown(self, commit: str) -> str:
        """The result as a markdown file: figures, kill points, configurations, problems."""
        mean = sum(self.trial_seconds) / len(self.trial_seconds) if self.trial_seconds else 0
        lines = [
            "# Fault-injection soak",
            "",
            f"`python -m tests.soak.run_soak --trials {self.trials} --seed {self.seed}` "
            f"at commit `{commit}`" + (" (with uncommitted changes)" if "+dirty" in commit else ""),
            "",
            "| | |",
            "|---|---|",
            f"| result | {'PASS' if self.ok else 'FAIL'} |",
            f"| trials | {self.trials} |",
            f"| kill points armed | {sum(self.armed_points.values())} |",
            f"| kill points hit (SIGKILL, then rerun) | {self.kills} |",
            f"| rows checked | {self.rows_checked} |",
            f"| rows lost | {self.lost} |",
            f"| rows duplicated | {self.duplicated} |",
            f"| failed commands | {len(self.worker_failures)} |",
            f"| wall time | {self.seconds:.0f} s ({mean:.1f} s of commands per trial) |",
            "",
            "| kill point | armed | hit |",
            "|---|---|---|",
        ]
        armed = Counter(p.split(":")[0] for p in self.armed_points.elements())
        lines += [f"| `{p}` | {armed[p]} | {self.hit_points.get(p, 0)} |" for p in sorted(armed)]
        lines += ["", "| engine / state store / equi mode | trials |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in sorted(self.configurations().items())]
        for title, counts in (("engine", self.engines()), ("state store", self.state_stores())):
            lines += ["", f"| {title} | trials |", "|---|---|"]
            lines += [f"| {k} | {n} |" for k, n in sorted(counts.items())]
        problems = [f"- seed {c.seed}: {p}" for c in self.checks for p in c.problems]
        problems += [f"- {f.strip()[:2000]}" for f in self.worker_failures]
        lines += ["", "## Problems", "", *(problems or ["none"]), ""]
        return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(counter.items()))


def run_soak(
    directory: Path,
    trials: int,
    seed: int,
    state_stores: Sequence[str | None] = (None,),
    worker_timeout: float = 3 * 3600,
    resume: bool = False,
    workers: int = 1,
    intervals: int = 2,
) -> SoakResult:
    """Run ``trials`` trials; trial n keeps its state in ``state_stores[n % len]`` (a
    SQLAlchemy URL; None: SQLite in the trial's folder). Each URL must name an empty
    database that no other trial uses.

    With ``resume`` the trials already under ``directory`` are continued where they stopped
    (the worker resumes each at its first unfinished command) instead of made anew.
    ``workers`` worker processes share the trials (trial i goes to worker i % workers).
    ``intervals``: hourly intervals per trial.
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
                intervals,
                state_store=state_stores[n % len(state_stores)],
            )
            for n in range(trials)
        ]
    trials = len(plans)
    result = SoakResult(trials, seed, plans=plans)
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
        if (root / "failed").exists():
            result.worker_failures.append(
                f"trial {root.name} (seed {plan.seed}, {plan.engine}, {plan.state_store}, "
                f"{plan.mode}): {(root / 'failed').read_text().strip()}"
            )
        elif (root / "progress").exists() and int((root / "progress").read_text()) == len(
            plan.commands
        ):
            result.checks.append(check_trial(root))
            result.trial_seconds.append(float((root / "seconds").read_text()))
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
        if worker.returncode != 0 and not _failed_trials(directory):
            return f"worker {shard}/{shards} exited {worker.returncode}: {worker.stderr[-3000:]}"
        return None  # the trials that failed say why in their folders
    return f"worker {shard}/{shards} was killed more often than there are trials"


def _failed_trials(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if (p / "failed").exists()]


@contextmanager
def state_stores_for(trials: int, postgres_every: int) -> Iterator[list[str | None]]:
    """Per trial: SQLite (None), or, for every ``postgres_every``-th trial, a fresh database
    of a throwaway PostgreSQL server that lives as long as the context."""
    if postgres_every <= 0 or trials < postgres_every:
        yield [None] * trials
        return
    from tests.postgres import PostgresServer

    server = PostgresServer()
    try:
        server.start()
        yield [
            server.url(server.create_database())
            if n % postgres_every == postgres_every - 1
            else None
            for n in range(trials)
        ]
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=REPO_ROOT / "var" / "soak")
    parser.add_argument("--out", type=Path, default=None, help="write the result as markdown")
    parser.add_argument(
        "--postgres-every",
        type=int,
        default=3,
        metavar="N",
        help="every N-th trial keeps its state in PostgreSQL (default 3; 0: none)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the trials already under --dir"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--intervals", type=int, default=2, help="intervals per trial (2)")
    args = parser.parse_args(argv)
    # A resumed soak keeps the state stores its configs name (a new server would not have
    # the old databases): resume SQLite-only soaks, or soaks whose server still runs.
    every = 0 if args.resume else args.postgres_every
    with state_stores_for(args.trials, every) as stores:
        result = run_soak(
            args.dir,
            args.trials,
            args.seed,
            stores,
            resume=args.resume,
            workers=args.workers,
            intervals=args.intervals,
        )
    print(result.summary())
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            result.markdown(
                short_commit(REPO_ROOT) + ("+dirty" if has_uncommitted_changes(REPO_ROOT) else "")
            )
        )
        print(f"wrote {args.out}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
