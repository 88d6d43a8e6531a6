"""Fault-injection soak of the whole pipeline; prints what it killed and what it checked.

    .venv/bin/python -m tests.soak.run_soak --trials 100 --seed 1 [--out FILE]
        [--postgres-every 3] [--object-store-every 4] [--stream-every 4] [--dir var/soak]
        [--resume]

Makes ``--trials`` seeded trials (see :mod:`tests.soak.trial`), runs them all through one
worker process (:mod:`tests.soak.worker`), starting it again after every SIGKILL, then
checks every trial's bronze, quarantines, silver, gold and late table against the DuckDB
oracle as multisets, by recorded master version. Every ``--postgres-every``-th trial keeps
its state store in PostgreSQL (a throwaway server on loopback, a database per trial).

One trial in every ``--object-store-every`` keeps its tables and its landing zone on an
S3-compatible object store: a bucket of its own on one SeaweedFS server on loopback that
the soak starts for the run and stops at the end
(:func:`warehouse.object_store_server.started_s3_server`); the worker processes and the
oracle reach it through its ``AWS_*`` environment. Which trial of each run of
``--object-store-every`` goes there rotates, so that the trials on the store cover every
mode x engine the seeds pick (:func:`object_store_trials`).

One trial in every ``--stream-every`` (a last, shorter run of trials included, so that a
soak of fewer trials still has one) is a stream trial: a run of its intervals goes through
the continuous mode, ``enrich stream`` as a process of its own, which is killed in a
micro-batch and started again (:func:`tests.soak.worker.run_stream`). Stream trials are
local, and which trial of a run is one rotates over the seeds' mode x engine as well
(:func:`stream_trials`).

Prints the result, writes it as markdown to ``--out``, and exits 1 if any row was lost or
duplicated, a tuple was answered from a version the contract does not allow, an
object-store trial kept data off its bucket, a stream trial's intervals were not loaded by
its stream, or a command failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.revision import has_uncommitted_changes, short_commit
from tests.soak.trial import (
    CONFIGURATION_CYCLE,
    TrialCheck,
    TrialPlan,
    check_trial,
    make_trial,
    stream_attempts,
)

if TYPE_CHECKING:
    from warehouse.object_store_server import S3Server

REPO_ROOT = Path(__file__).resolve().parents[2]
STORAGE_NAMES = {"local": "local", "s3": "object store"}
RUN_MODES = {False: "scheduled", True: "continuous (stream)"}


class ResumeError(ValueError):
    """Trials that cannot be resumed as asked."""


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
    postgres_every: int | None = None
    object_store_every: int | None = None
    stream_every: int | None = None

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
        """Trials (checked or failed) per engine x state store x storage x equi mode."""
        return Counter(
            f"{p.engine} / {p.state_store} / {STORAGE_NAMES[p.storage]} / {p.mode}"
            + (f"+late {p.late_wait}" if p.late_wait else "")
            + (" / stream" if p.stream else "")
            for p in self.plans
        )

    def engines(self) -> Counter[str]:
        return Counter(p.engine for p in self.plans)

    def state_stores(self) -> Counter[str]:
        return Counter(p.state_store for p in self.plans)

    def storages(self) -> Counter[str]:
        return Counter(STORAGE_NAMES[p.storage] for p in self.plans)

    def run_modes(self) -> Counter[str]:
        return Counter(RUN_MODES[p.stream] for p in self.plans)

    def stream_figures(self) -> dict[str, int]:
        """Over the stream trials: trials, kills hit (all in a stream's micro-batch),
        ``enrich stream`` starts, streamed intervals and those delivered to a running
        stream, micro-batches (the killed starts cannot say theirs), and landing files the
        streams loaded."""
        plans = [p for p in self.plans if p.stream]
        attempts = [a for p in plans for a in stream_attempts(Path(p.root))]
        return {
            "trials": len(plans),
            "kills": sum(1 for p in plans if _was_hit(p)),
            "starts": len(attempts),
            "intervals": sum(len(p.streamed) for p in plans),
            "live": sum(len(a["live"]) for a in attempts),
            "micro_batches": sum(a["micro_batches"] or 0 for a in attempts),
            "files": sum(c.streamed_files for c in self.checks if c.stream),
        }

    def stream_line(self) -> str:
        f = self.stream_figures()
        return (
            f"continuous mode: {f['trials']} trial(s), kills hit in a stream micro-batch: "
            f"{f['kills']}, stream starts: {f['starts']}, intervals streamed: "
            f"{f['intervals']} ({f['live']} delivered to a running stream), micro-batches "
            f"of the starts that stopped by themselves: {f['micro_batches']}, files loaded by "
            f"the stream: {f['files']}"
        )

    def storage_rows(self) -> list[str]:
        """Per storage: trials, kills hit (those between a commit's data files and its
        commit file apart) and rows checked, as markdown table rows."""
        rows = []
        for storage, name in STORAGE_NAMES.items():
            plans = [p for p in self.plans if p.storage == storage]
            if not plans:
                continue
            hit = [p.crash.point.split(":")[0] for p in plans if _was_hit(p)]
            checked = sum(c.rows_checked for c in self.checks if c.storage == storage)
            rows.append(
                f"| {name} | {len(plans)} | {len(hit)} | {hit.count('delta.before_commit')} "
                f"| {checked} |"
            )
        return rows

    def command(self) -> str:
        options = [f"--trials {self.trials}", f"--seed {self.seed}"]
        if self.postgres_every is not None:
            options.append(f"--postgres-every {self.postgres_every}")
        if self.object_store_every is not None:
            options.append(f"--object-store-every {self.object_store_every}")
        if self.stream_every is not None:
            options.append(f"--stream-every {self.stream_every}")
        return "python -m tests.soak.run_soak " + " ".join(options)

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
            "storage: " + _counts(self.storages()),
            "run modes: " + _counts(self.run_modes()),
            self.stream_line(),
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
            f"`{self.command()}` at commit `{commit}`"
            + (" (with uncommitted changes)" if "+dirty" in commit else ""),
            "",
            "| | |",
            "|---|---|",
            f"| result | {'PASS' if self.ok else 'FAIL'} |",
            f"| trials | {self.trials} |",
            f"| trials on the object store | {self.storages()['object store']} |",
            f"| trials in the continuous mode (stream) | {self.stream_figures()['trials']} |",
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
        lines += ["", "| engine / state store / storage / equi mode | trials |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in sorted(self.configurations().items())]
        for title, counts in (("engine", self.engines()), ("state store", self.state_stores())):
            lines += ["", f"| {title} | trials |", "|---|---|"]
            lines += [f"| {k} | {n} |" for k, n in sorted(counts.items())]
        lines += [
            "",
            "| storage | trials | kill points hit | of them `delta.before_commit` | rows checked |",
            "|---|---|---|---|---|",
            *self.storage_rows(),
        ]
        f = self.stream_figures()
        lines += [
            "",
            "| continuous mode | |",
            "|---|---|",
            f"| stream trials | {f['trials']} |",
            f"| kills hit in a stream micro-batch | {f['kills']} |",
            f"| `enrich stream` starts | {f['starts']} |",
            f"| intervals streamed (delivered to a running stream) | {f['intervals']} "
            f"({f['live']}) |",
            f"| micro-batches of the starts that stopped by themselves | {f['micro_batches']} |",
            f"| landing files loaded by the stream | {f['files']} |",
        ]
        problems = [f"- seed {c.seed}: {p}" for c in self.checks for p in c.problems]
        problems += [f"- {f.strip()[:2000]}" for f in self.worker_failures]
        lines += ["", "## Problems", "", *(problems or ["none"]), ""]
        return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(counter.items()))


def _was_hit(plan: TrialPlan) -> bool:
    """Whether the trial's armed kill happened (the worker armed it and never got past it)."""
    root = Path(plan.root)
    return (root / "crash_armed").exists() and not (root / "crash_missed").exists()


def stream_trials(seeds: Sequence[int], every: int | None, on_store: set[int]) -> set[int]:
    """The trials (indexes into ``seeds``) that run in the continuous mode: one of every
    ``every`` consecutive trials, a last, shorter run included (none for None or 0), never
    one in ``on_store`` (a stream trial is local).

    Each pick is the first trial of its run, or the first whose seed gives a mode x engine
    (they repeat every :data:`~tests.soak.trial.CONFIGURATION_CYCLE` seeds) the stream
    trials have not had yet in this round: a fixed stride that is a multiple of the cycle
    would give the stream one configuration only."""
    if not every or every <= 0:
        return set()
    picked: set[int] = set()
    had: set[int] = set()
    for start in range(0, len(seeds), every):
        block = [n for n in range(start, min(start + every, len(seeds))) if n not in on_store]
        if not block:
            continue
        if len(had) == CONFIGURATION_CYCLE:  # every configuration had: a new round
            had = set()
        fresh = [n for n in block if seeds[n] % CONFIGURATION_CYCLE not in had]
        pick = (fresh or block)[0]
        had.add(seeds[pick] % CONFIGURATION_CYCLE)
        picked.add(pick)
    return picked


def object_store_trials(seeds: Sequence[int], every: int | None) -> set[int]:
    """The trials (indexes into ``seeds``) that run on the object store: one of every
    ``every`` consecutive trials (none for None or 0, and none in a last, shorter run).

    The first run's pick is its last trial, as with the PostgreSQL trials; each later pick
    is the last trial of its run whose seed gives a mode x engine (both repeat every
    :data:`~tests.soak.trial.CONFIGURATION_CYCLE` seeds) the store has not had yet in this
    round, so that with ``every`` even (a fixed stride would give the store seeds of one
    parity, always SSBJ) the trials on the store still cover every configuration."""
    if not every or every <= 0:
        return set()
    picked: set[int] = set()
    pending: list[int] = []
    for start in range(0, len(seeds) - every + 1, every):
        block = range(start, start + every)
        if not pending:  # a new round, from the residue of the run's last seed down
            last = seeds[block[-1]] % CONFIGURATION_CYCLE
            pending = [(last - i) % CONFIGURATION_CYCLE for i in range(CONFIGURATION_CYCLE)]
        present = {seeds[n] % CONFIGURATION_CYCLE: n for n in block}  # the last of each
        wanted = next((r for r in pending if r in present), None)
        if wanted is None:  # a run shorter than the cycle holds none of those pending
            picked.add(block[-1])
            continue
        pending.remove(wanted)
        picked.add(present[wanted])
    return picked


def run_soak(
    directory: Path,
    trials: int,
    seed: int,
    state_stores: Sequence[str | None] = (None,),
    worker_timeout: float = 3 * 3600,
    resume: bool = False,
    workers: int = 1,
    intervals: int = 2,
    object_store_every: int | None = 4,
    s3_server: S3Server | None = None,
    postgres_every: int | None = None,
    stream_every: int | None = 4,
) -> SoakResult:
    """Run ``trials`` trials; trial n keeps its state in ``state_stores[n % len]`` (a
    SQLAlchemy URL; None: SQLite in the trial's folder). Each URL must name an empty
    database that no other trial uses.

    One trial in every ``object_store_every`` (:func:`object_store_trials`; None or 0:
    none) keeps its tables and landing zone in a bucket of its own on ``s3_server``, or on
    a SeaweedFS server started for the run and stopped at its end when that is None.
    One trial in every ``stream_every`` (:func:`stream_trials`; None or 0: none) runs a
    part of its intervals in the continuous mode; with the default of 4 a soak of up to 4
    trials has exactly one (the first not on the object store).

    With ``resume`` the trials already under ``directory`` are continued where they stopped
    (the worker resumes each at its first unfinished command) instead of made anew; trials
    on the object store only with the ``s3_server`` that holds their buckets.
    ``workers`` worker processes share the trials (trial i goes to worker i % workers).
    ``intervals``: hourly intervals per trial. ``postgres_every`` is only shown in the
    result's command line (``state_stores`` says which trial is where).
    """
    started = time.monotonic()
    if resume and directory.exists():
        plans = [TrialPlan.load(p) for p in sorted(directory.iterdir()) if p.name.startswith("t")]
        on_store = {n for n, plan in enumerate(plans) if plan.bucket is not None}
        if on_store and s3_server is None:
            raise ResumeError(
                f"{len(on_store)} trial(s) under {directory} are on an object store whose "
                "server stopped with the run that made them: resume them with that server "
                "(s3_server), or start the soak anew"
            )
    else:
        plans = []
        seeds = [seed + n for n in range(trials)]
        on_store = object_store_trials(seeds, object_store_every)
        streamed = stream_trials(seeds, stream_every, on_store)
    with ExitStack() as stack:
        server = s3_server
        if server is None and on_store:
            from warehouse.object_store_server import started_s3_server

            server = started_s3_server()
            stack.callback(server.stop)
        if server is not None:
            # make_trial, the oracle (here) and the workers (children) reach the store
            # through the AWS_* variables, as the pipeline's commands do.
            stack.enter_context(_environment(server.environment()))
        if not plans:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            plans = [
                make_trial(
                    directory / f"t{seed + n:05d}",
                    seed + n,
                    intervals,
                    state_store=state_stores[n % len(state_stores)],
                    bucket=(
                        server.create_bucket(f"soak-t{seed + n:05d}")
                        if server is not None and n in on_store
                        else None
                    ),
                    stream=n in streamed,
                )
                for n in range(trials)
            ]
        result = _run_trials(directory, plans, workers, worker_timeout)
    result.seed = seed
    result.postgres_every = postgres_every
    result.object_store_every = object_store_every
    result.stream_every = stream_every
    result.seconds = time.monotonic() - started
    return result


def _run_trials(
    directory: Path, plans: list[TrialPlan], workers: int, worker_timeout: float
) -> SoakResult:
    """Run the planned trials through the workers, then check each finished one."""
    trials = len(plans)
    result = SoakResult(trials, plans=plans)
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
        if _was_hit(plan):
            result.hit_points[plan.crash.point.split(":")[0]] += 1
        if (root / "failed").exists():
            result.worker_failures.append(
                f"trial {root.name} (seed {plan.seed}, {plan.engine}, {plan.state_store}, "
                f"{STORAGE_NAMES[plan.storage]}, {plan.mode}"
                f"{', stream' if plan.stream else ''}): "
                f"{(root / 'failed').read_text().strip()}"
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
    return result


@contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment (inherited by the workers) for the
    duration; what was there before is restored after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
        "--object-store-every",
        type=int,
        default=4,
        metavar="N",
        help="one trial in every N keeps its tables and landing zone on an object store "
        "(a SeaweedFS server started for the run; default 4; 0: none)",
    )
    parser.add_argument(
        "--stream-every",
        type=int,
        default=4,
        metavar="N",
        help="one trial in every N (and one in a last, shorter run) puts a run of its "
        "intervals through `enrich stream`, killed in a micro-batch and started again "
        "(default 4; 0: none)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the trials already under --dir (not those on the object store, "
        "whose server stopped with their run)",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--intervals", type=int, default=2, help="intervals per trial (2)")
    args = parser.parse_args(argv)
    # A resumed soak keeps the state stores its configs name (a new server would not have
    # the old databases): resume SQLite-only soaks, or soaks whose server still runs.
    every = 0 if args.resume else args.postgres_every
    with state_stores_for(args.trials, every) as stores:
        try:
            result = run_soak(
                args.dir,
                args.trials,
                args.seed,
                stores,
                resume=args.resume,
                workers=args.workers,
                intervals=args.intervals,
                object_store_every=args.object_store_every,
                postgres_every=args.postgres_every,
                stream_every=args.stream_every,
            )
        except ResumeError as e:
            print(e, file=sys.stderr)
            return 2
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
