"""One soak trial: its seeded plan, its landing files, its master commits and its DuckDB
oracle (no Spark here).

A trial is a small pipeline run over a few hourly intervals by a list of commands. Stream
``s`` (JSON files, ``id_column: id``) feeds two stages:

- ``enrich``: a left equi join onto master ``m`` -> ``out``; SSBJ, the plain join
  (``baseline``) or ``auto`` by seed. A plain/auto stage waits for late master rows
  (``operator.late_master``; :data:`LATE_MASTER_MODES` says which modes may).
- ``promo``: a left theta join (range predicate ``lo <= k < hi``) onto master ``p`` ->
  ``outp``, with a seeded scheme.

The commands::

    deliver i, run, validate            for every interval i
    backfill [b, b+1h)                  once, after a random interval
    drain, validate                     at the end
    master (append, MERGE, overwrite)   interleaved at random points, written with deltalake
    maintain --retention-hours 0        once, at a random point (compaction and vacuum)

A stream trial (``stream``; the harness picks them) runs the continuous mode for a seeded
run of consecutive intervals: one ``stream`` command stands for their ``deliver, run,
validate``. The worker starts ``enrich stream`` as a process of its own, delivers those
intervals into the landing zone one by one while it runs (each micro-batch ingests what
landed, steps every stage and publishes, under the lease the scheduled commands take too),
and the process is SIGKILLed at a crash point a micro-batch surely passes; the worker
delivers what is left and starts it again to finish (:func:`tests.soak.worker.run_stream`).
The intervals before and after it are scheduled as in any trial; the backfill, master
commits and ``maintain`` fall between commands as in any trial (never during the stream:
the masters stay at one version for all its micro-batches).

Each interval delivers good files and, at random, the faults a producer causes: malformed
records, glob-looking names beside their twins, a file that is not UTF-8, a file with an
unexpected column, the same content under a new name, an identical re-delivery, a symlink
to a file outside the zone, an in-progress file, and re-sent records (ids already loaded,
in a new file: same content is a re-send, other content a conflict). One command of the
trial is armed to SIGKILL itself at a random crash point (a named point, or the n-th Delta
commit before or after it lands); the worker is restarted at that command (a stream trial
arms its ``stream`` command, whose process is the one killed). Each trial
picks its Delta engine (embedded or native) by seed; the harness picks its state store and
its storage.

A trial on the object store (``storage == "s3"``, a bucket of its own on an S3-compatible
server) keeps every Delta table (bronze, silver, gold, the late tables and operator state,
the quarantines, the masters) under ``s3://<bucket>/wh`` and its landing zone at
``s3://<bucket>/landing``; its local folder keeps the plan, the logs, the state store
(SQLite, or the PostgreSQL database the harness gave it) and the driver's other files
(``warehouse.local_root``). Endpoint and credentials come from the ``AWS_*`` environment
(:class:`warehouse.object_store.ObjectStore`). There the faults are the store's: a file is
delivered as one PUT (a re-delivery is another PUT of the same bytes under the same key), an
in-progress file is a multipart upload that is started, given a part and never completed
(the pipeline must not read it), and a symlink to a file outside the zone has no
equivalent (an object store has no links), so object-store trials plan none. The master
writer commits with deltalake on the same store, and half of these trials (besides those
that draw it anyway) arm ``delta.before_commit``: a kill after a commit's data files are
PUT and before its commit file is.

The worker logs, before every command, the version of each master and that version's rows
(read with deltalake as it is current): masters change only between commands (the trial's
own commits, ``maintain``'s compaction), so that log says which version was in force at
every step, and it outlives the vacuum. The oracle (:func:`check_trial`) derives, per
stage and stream tuple, the outcomes the correctness contract allows (see
:func:`_allowed`), joins each with the master as of its version in DuckDB, and compares
silver, gold, the late table, bronze and the quarantines with them as multisets.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import yaml
from deltalake import DeltaTable, write_deltalake

from tests.helpers import equi_stage, json_stream
from warehouse.object_store import ObjectLocation, ObjectStore, object_stamp, storage_options

BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)
# Keys 1-6 start in master m (some with 2 rows); 7-10 arrive later, or never.
INITIAL_KEYS = range(1, 7)
ALL_KEYS = range(1, 11)
STREAM_KEYS = [1, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10]
# Master p: (pid, lo, hi, pname); the ranges overlap, so a tuple may match 0, 1 or 2 rows.
INITIAL_PROMOS = [(1, 1, 4, "p1"), (2, 3, 7, "p2"), (3, 8, 12, "p3")]
NAMED_POINTS = (
    "ssbj.after_output",
    "ssbj.before_complete",
    "stage.after_output_commit",
    "audit.before_publish",
    "audit.after_publish",
)
COMMIT_POINTS = ("delta.before_commit", "delta.after_commit")
ENGINES = ("embedded", "native")
# Modes of ``enrich`` by seed % 4.
MODES = ("ssbj", "baseline", "ssbj", "auto")
# Modes whose stage waits for late master rows (``operator.late_master``): the plain join
# keeps them in a late table (``auto`` picks it for such a stage), SSBJ in its state.
LATE_MASTER_MODES = ("baseline", "auto", "ssbj")
THETA_SCHEMES = ("auto", "adsp", "spark")
# Exit codes a command may end with in a correct run (4: rejected files still in place;
# ``enrich stream`` logs a micro-batch's 4 and goes on).
ALLOWED_EXIT = {
    "run": (0, 4),
    "validate": (0,),
    "backfill": (0,),
    "drain": (0,),
    "maintain": (0,),
    "stream": (0,),
}
# The commands at which the stages make steps (and so may answer a waiting tuple); a
# ``stream`` command takes a step of every stage in each of its micro-batches.
STEP_KINDS = ("run", "drain", "stream")
# ``enrich stream`` as a stream trial runs it: a micro-batch a second at most (the trials'
# freshness allows far longer), stopped once idle for a few triggers. A delivery pauses
# less than the idle time (STREAM_DELIVERY_GAP in the worker), so the stream does not stop
# between two of its intervals. The idle clock starts once the stream's first tick has
# run (``pipeline.stream_service``), so the queries' start (2.8 s on delta-spark) does not
# count. The first start of a trial is the one armed to be killed: it may run long; the
# start that finishes is bounded, as a quiet tick steps only for work due without input
# (``StageDriver.work_due``: tuples waiting for late master rows are not, while the
# masters stay as they are).
STREAM_TRIGGER = "1s"
STREAM_IDLE_SECONDS = 4
STREAM_ARMED_MAX_SECONDS = 120
STREAM_FINAL_MAX_SECONDS = 30
# Run ids of the stream's micro-batches (``pipeline.stream_service``: ``stream-clock-<n>``).
STREAM_RUN_PREFIX = "stream-"
# The worker's record of a stream trial's ``enrich stream`` starts, a JSON object a line.
STREAM_LOG = "stream.jsonl"
MASTER_SCHEMAS = {
    "m": pa.schema([("mk", pa.int64()), ("name", pa.string())]),
    "p": pa.schema(
        [("pid", pa.int64()), ("lo", pa.int64()), ("hi", pa.int64()), ("pname", pa.string())]
    ),
}
VERSIONS_FILE = "master_versions.json"
# Outbox files a producer is still writing: a local name the zone skips, on the store a
# multipart upload never completed.
IN_PROGRESS_PREFIX = "_inprogress_"
MASTER_ROWS_DIR = "master_rows"


@dataclass(frozen=True)
class Command:
    kind: str
    interval: int = 0
    args: tuple[str, ...] = ()
    # A ``stream`` command: the intervals it delivers while the stream runs.
    intervals: tuple[int, ...] = ()

    def stream_args(self, max_seconds: int) -> list[str]:
        """The ``enrich`` arguments of a ``stream`` command's start that stops by itself
        after at most ``max_seconds``."""
        return [*self.args, "--max-seconds", str(max_seconds)]


@dataclass(frozen=True)
class Crash:
    command: int
    point: str

    def env_value(self) -> str:
        return self.point


@dataclass(frozen=True)
class TrialPlan:
    seed: int
    root: str
    intervals: int
    commands: tuple[Command, ...]
    crash: Crash
    faults: tuple[str, ...]
    engine: str
    mode: str
    late_wait: str | None  # the ``enrich`` stage's late_master wait; None: no wait
    theta_scheme: str
    state_store: str  # "sqlite" or "postgres"
    storage: str = "local"  # "local", or "s3": the tables and the landing zone in ``bucket``
    bucket: str | None = None
    stream: bool = False  # some intervals go through the continuous mode (a ``stream`` command)

    @property
    def warehouse(self) -> str:
        """The warehouse root: a folder of the trial's, or ``s3://<bucket>/wh``."""
        return f"s3://{self.bucket}/wh" if self.bucket else str(Path(self.root) / "wh")

    @property
    def landing(self) -> str:
        """The landing zone: a folder of the trial's, or ``s3://<bucket>/landing``."""
        return f"s3://{self.bucket}/landing" if self.bucket else str(Path(self.root) / "landing")

    def save(self) -> None:
        (Path(self.root) / "plan.json").write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(root: Path) -> TrialPlan:
        raw = json.loads((root / "plan.json").read_text())
        return TrialPlan(
            seed=raw["seed"],
            root=raw["root"],
            intervals=raw["intervals"],
            commands=tuple(
                Command(c["kind"], c["interval"], tuple(c["args"]), tuple(c.get("intervals", ())))
                for c in raw["commands"]
            ),
            crash=Crash(**raw["crash"]),
            faults=tuple(raw["faults"]),
            engine=raw["engine"],
            mode=raw["mode"],
            late_wait=raw["late_wait"],
            theta_scheme=raw["theta_scheme"],
            state_store=raw["state_store"],
            # Plans written before trials could run on the object store are local.
            storage=raw.get("storage", "local"),
            bucket=raw.get("bucket"),
            # And before stream trials, every trial was scheduled.
            stream=raw.get("stream", False),
        )

    @property
    def streamed(self) -> dict[int, int]:
        """Interval -> index of the ``stream`` command that delivers it."""
        return {
            interval: index
            for index, command in enumerate(self.commands)
            if command.kind == "stream"
            for interval in command.intervals
        }


def config(
    root: Path,
    state_store: str | None = None,
    mode: str = "ssbj",
    engine: str = "embedded",
    late_wait: str | None = None,
    theta_scheme: str = "auto",
    bucket: str | None = None,
) -> dict[str, Any]:
    """The trial's pipeline config; with ``bucket`` its warehouse and landing zone are in
    that bucket of the object store, the driver's own files in ``root/driver``."""
    operator: dict[str, Any] = {"mode": mode, "partitions": 2, "steps_per_run": 1}
    if late_wait is not None:
        operator["late_master"] = {"wait": late_wait}
    warehouse: dict[str, Any] = {
        "root": f"s3://{bucket}/wh" if bucket else str(root / "wh"),
        "state_store": state_store or f"sqlite:///{root / 'state.db'}",
        "engine": engine,
    }
    if bucket:
        warehouse["local_root"] = str(root / "driver")
    return {
        "name": "soak",
        "warehouse": warehouse,
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "1"}},
        "schedule": {"interval": "1h", "start": BASE_TIME.isoformat()},
        "streams": {
            "s": json_stream(
                f"s3://{bucket}/landing" if bucket else str(root / "landing"),
                ["id bigint not null", "k bigint", "v string", "ts timestamp not null"],
            )
        },
        "masters": {
            "m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "name"]},
            "p": {"table": "masters/p", "keys": ["pid"], "columns": ["pid", "lo", "hi", "pname"]},
        },
        "stages": [
            equi_stage(
                join="left",
                operator=operator,
                # One step a run over k = 2 partitions: a tuple waits up to two runs, and
                # a late master row up to two hours.
                freshness={"complete_within": "2 intervals"},
            ),
            {
                "name": "promo",
                "kind": "theta",
                "input": "s",
                "master": "p",
                "predicate": {"type": "range", "stream_column": "k", "lo": "lo", "hi": "hi"},
                "join": "left",
                "output": "outp",
                "operator": {"scheme": theta_scheme, "task_memory_bytes": 262144},
            },
        ],
    }


def seed_configuration(seed: int) -> tuple[str, str]:
    """The ``enrich`` mode and the Delta engine a seed picks: the mode by ``seed % 4``, the
    engine by the seed's second bit, so that consecutive seeds cover every mode x engine
    (both repeat every :data:`CONFIGURATION_CYCLE` seeds)."""
    return MODES[seed % len(MODES)], ENGINES[(seed // 2) % len(ENGINES)]


CONFIGURATION_CYCLE = 4


def make_trial(
    root: Path,
    seed: int,
    intervals: int = 2,
    state_store: str | None = None,
    bucket: str | None = None,
    stream: bool = False,
) -> TrialPlan:
    """Write the trial's config, masters and outbox files; return its plan.

    ``state_store`` is a SQLAlchemy URL (a PostgreSQL database, say); SQLite by default.
    With ``bucket`` (an existing, empty bucket of the object store the ``AWS_*``
    environment names) the trial's tables and landing zone are in that bucket. With
    ``stream`` a seeded run of its intervals goes through the continuous mode, which is
    where the trial's kill is armed; a stream trial is local (the worker follows the
    stream's progress in its checkpoint folder).
    """
    if stream and bucket is not None:
        raise ValueError("a stream trial keeps its tables and landing zone on local disk")
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    mode, engine = seed_configuration(seed)
    # A short wait expires tuples at a later step (which one depends on the wall clock: the
    # oracle allows each); a long one keeps them waiting to the end.
    late_wait = rng.choice(("2h", "2h", "1s")) if mode in LATE_MASTER_MODES else None
    theta_scheme = rng.choice(THETA_SCHEMES)
    (root / "config.yaml").write_text(
        yaml.safe_dump(config(root, state_store, mode, engine, late_wait, theta_scheme, bucket))
    )
    if bucket is None:
        (root / "landing").mkdir(exist_ok=True)
    masters = _write_masters(f"s3://{bucket}/wh" if bucket else str(root / "wh"), rng)
    faults: list[str] = []
    next_id = 1
    earlier: list[Path] = []
    loaded: list[tuple[int, dict[str, Any]]] = []  # (interval, record) of good files
    resent_any = False
    for interval in range(intervals):
        outbox = root / "outbox" / str(interval)
        outbox.mkdir(parents=True, exist_ok=True)
        for n in range(rng.randint(1, 2)):
            rows, next_id = _rows(rng, interval, next_id, rng.randint(8, 20))
            loaded += [(interval, r) for r in rows]
            bad = _malformed(rng, interval) if rng.random() < 0.5 else []
            if bad:
                faults.append(f"i{interval}: {len(bad)} malformed record(s)")
            path = outbox / f"good_{interval}_{n}.json"
            _write_lines(path, [json.dumps(r) for r in rows] + bad)
            earlier.append(path)
        if rng.random() < 0.5:
            for name in (f"g[{interval}].json", f"g{interval}.json"):
                rows, next_id = _rows(rng, interval, next_id, 5)
                loaded += [(interval, r) for r in rows]
                _write_lines(outbox / name, [json.dumps(r) for r in rows])
            faults.append(f"i{interval}: glob-looking name beside its twin")
        previous = [r for i, r in loaded if i < interval]
        last = interval == intervals - 1
        if previous and (rng.random() < 0.6 or (last and not resent_any)):
            # A producer retry: records it already delivered (some changed since), in a
            # new file beside new ones, so the file's bytes are new.
            picked = rng.sample(previous, min(len(previous), rng.randint(3, 5)))
            conflicts = rng.randint(1, 2)
            again = [dict(r, v=f"{r['v']}~c") for r in picked[:conflicts]] + picked[conflicts:]
            fresh, next_id = _rows(rng, interval, next_id, 2)
            records = again + fresh
            rng.shuffle(records)
            _write_lines(outbox / f"resend_{interval}.json", [json.dumps(r) for r in records])
            faults.append(
                f"i{interval}: {len(picked) - conflicts} re-sent id(s), {conflicts} conflict(s)"
            )
            resent_any = True
        if rng.random() < 0.3:
            (outbox / f"latin1_{interval}.json").write_bytes(
                b'{"id": 999001, "k": 1, "v": "caf\xe9", "ts": "2024-01-01T00:00:00"}\n'
            )
            faults.append(f"i{interval}: not UTF-8")
        if rng.random() < 0.3:
            _write_lines(
                outbox / f"drift_{interval}.json",
                ['{"id": 999002, "k": 1, "v": "x", "ts": "2024-01-01T00:00:00", "extra": 1}'],
            )
            faults.append(f"i{interval}: unexpected column")
        if interval and rng.random() < 0.5:
            source = rng.choice(earlier[:-1] or earlier)
            (outbox / f"copy_{interval}_{source.name}").write_bytes(source.read_bytes())
            faults.append(f"i{interval}: same content under a new name")
        if interval and rng.random() < 0.4:
            source = rng.choice(earlier[:-1] or earlier)
            (outbox / f"redeliver__{source.name}").write_bytes(source.read_bytes())
            faults.append(f"i{interval}: identical re-delivery")
        if rng.random() < 0.3:
            # Drawn on the store too, so that a seed plans the same files wherever it runs.
            rows, _ = _rows(rng, interval, 990_000, 2)
            if bucket is None:  # an object store has no links
                outside = root / "outside.json"
                _write_lines(outside, [json.dumps(r) for r in rows])
                (outbox / f"link_{interval}.json.symlink").write_text(str(outside))
                faults.append(f"i{interval}: symlink to a file outside the zone")
        if rng.random() < 0.3:
            rows, _ = _rows(rng, interval, 980_000, 2)
            _write_lines(
                outbox / f"{IN_PROGRESS_PREFIX}{interval}.json", [json.dumps(r) for r in rows]
            )
            faults.append(
                f"i{interval}: "
                + ("in-progress file" if bucket is None else "multipart upload never completed")
            )
    commands = _with_master_changes(_commands(rng, intervals, stream), masters, rng)
    if stream:
        armed = next(i for i, c in enumerate(commands) if c.kind == "stream")
        crash = Crash(armed, _stream_crash_point(rng, mode))
    else:
        crash = _crash(rng, commands, mode, bucket)
    plan = TrialPlan(
        seed,
        str(root),
        intervals,
        tuple(commands),
        crash,
        tuple(faults),
        engine,
        mode,
        late_wait,
        theta_scheme,
        "postgres" if (state_store or "").startswith("postgresql") else "sqlite",
        "local" if bucket is None else "s3",
        bucket,
        stream,
    )
    plan.save()
    return plan


def _stream_crash_point(rng: random.Random, mode: str) -> str:
    """A point the armed ``enrich stream`` surely reaches, at a hit it surely reaches.

    Once an interval is delivered, one micro-batch ingests its files (a bronze commit each,
    and the quarantine's), steps the theta stage (its output commit: the stateless driver's
    point) and the equi stage, and publishes what they staged (at least the theta output:
    an audit and a gold commit); a plain join (``baseline``, and ``auto``, which picks it
    for a stage that waits for late master rows) passes the stateless point as well. An
    SSBJ stage steps in every micro-batch while tuples wait in H_S, which new ones do for
    a whole R-cycle of k = 2 steps. The n-th hit counts the process's hits, those of the
    micro-batches before the first delivery included."""
    ssbj = mode == "ssbj"
    points = [*COMMIT_POINTS] * 2 + [
        "stage.after_output_commit",
        "audit.before_publish",
        "audit.after_publish",
        *(("ssbj.after_output", "ssbj.before_complete") if ssbj else ()),
    ]
    point = rng.choice(points)
    most = {
        "delta.before_commit": 4,
        "delta.after_commit": 4,
        "stage.after_output_commit": 1 if ssbj else 2,  # only the theta stage's, if SSBJ
        "audit.before_publish": 2,  # both outputs publish before the stream goes idle
        "audit.after_publish": 2,
        "ssbj.after_output": 2,
        "ssbj.before_complete": 2,
    }[point]
    return f"{point}:{rng.randint(1, most)}"


def _crash(rng: random.Random, commands: list[Command], mode: str, bucket: str | None) -> Crash:
    """A scheduled trial's kill: a random command that may be killed, at a random point
    its kind passes."""
    armable = [i for i, c in enumerate(commands) if c.kind in ALLOWED_EXIT]
    armed = rng.choice(armable)
    kind = commands[armed].kind
    stage_points = ("ssbj.",) if mode == "ssbj" else ("stage.",)
    points = [*COMMIT_POINTS] * 2 + [
        p
        for p in NAMED_POINTS
        if (p.startswith(stage_points) and kind in ("run", "drain"))
        or (p.startswith("audit") and kind in ("validate", "backfill"))
    ]
    point = rng.choice(points)
    # Delta commits per command here: a run ~10 (two stages; an SSBJ step commits twice),
    # a drain ~5, a maintain several (compactions, vacuums), a backfill 3-4, a validate 1
    # or more (armed at the first, so that it is surely hit).
    most = {"run": 8, "drain": 4, "maintain": 4, "backfill": 3, "validate": 1}[kind]
    if bucket is not None and rng.random() < 0.5:
        # On the store half the trials are killed between a commit's data files (PUT
        # already) and its commit file: the files must stay unreferenced, the rerun's
        # commit must not take them in twice. Armed where it is surely reached (counted
        # on the store, both engines): a run commits 4-10 times, a backfill 4, but a drain
        # or a validate may not commit at all, and maintain's compactions and vacuums
        # commit without passing the point.
        point = "delta.before_commit"
        if kind not in ("run", "backfill"):
            armed = rng.choice([i for i in armable if commands[i].kind in ("run", "backfill")])
            kind = commands[armed].kind
        most = 4
    nth = rng.randint(1, most if point in COMMIT_POINTS else 2)
    return Crash(armed, f"{point}:{nth}")


def _commands(rng: random.Random, intervals: int, stream: bool = False) -> list[Command]:
    """Per interval ``deliver, run, validate`` (one ``stream`` command for the streamed
    ones, with ``stream``), the backfill after a random interval, ``drain, validate``."""
    commands: list[Command] = []
    backfill_after = rng.randrange(intervals)
    streamed: range = range(0)
    if stream:  # drawn only for a stream trial: a scheduled one keeps the plan its seed had
        first = rng.randrange(intervals)
        streamed = range(first, rng.randrange(first, intervals) + 1)
    for interval in range(intervals):
        if interval not in streamed:
            commands += [
                Command("deliver", interval),
                Command("run", interval, ("run", "--run-id", f"i{interval}")),
                Command("validate", interval, ("validate", "--run-id", f"i{interval}")),
            ]
        elif interval == streamed.start:
            commands.append(
                Command(
                    "stream",
                    interval,
                    (
                        "stream",
                        "--trigger",
                        STREAM_TRIGGER,
                        "--idle-stop",
                        str(STREAM_IDLE_SECONDS),
                    ),
                    tuple(streamed),
                )
            )
        # After the stream command when the interval is one of its (a backfill of a
        # streamed interval follows the stream that delivered it).
        if interval == backfill_after:
            start = BASE_TIME + timedelta(hours=rng.randrange(interval + 1))
            end = start + timedelta(hours=1)
            commands.append(
                Command(
                    "backfill",
                    interval,
                    (
                        *("backfill", "--run-id", f"bf{interval}"),
                        *("--start", start.isoformat(), "--end", end.isoformat()),
                    ),
                )
            )
    return [
        *commands,
        Command("drain", intervals, ("drain", "--run-id", "final")),
        Command("validate", intervals, ("validate", "--run-id", "final")),
    ]


def _with_master_changes(
    commands: list[Command], masters: dict[str, list[dict[str, Any]]], rng: random.Random
) -> list[Command]:
    """``commands`` with the master commits and one ``maintain`` inserted at random gaps
    (after the first delivery, before the final drain at the latest): m gets an append of
    new keys, a MERGE (an update, a delete, an insert) and a full overwrite in a random
    order; p one of them."""
    kinds = [("m", k) for k in rng.sample(["append", "merge", "overwrite"], 3)]
    kinds.append(("p", rng.choice(["append", "merge", "overwrite"])))
    gaps = sorted(rng.randint(1, len(commands) - 2) for _ in kinds)
    inserted: dict[int, list[Command]] = defaultdict(list)
    for n, ((table, kind), gap) in enumerate(zip(kinds, gaps, strict=True)):
        change = _master_change(table, kind, masters[table], rng, n)
        inserted[gap].append(Command("master", 0, (json.dumps(change),)))
    maintain = ("maintain", "--run-id", "maint", "--retention-hours", "0")
    inserted[rng.randint(1, len(commands) - 2)].append(Command("maintain", 0, maintain))
    out: list[Command] = []
    for index, command in enumerate(commands):
        out += inserted.get(index, [])
        out.append(command)
    return out


def _master_change(
    table: str, kind: str, rows: list[dict[str, Any]], rng: random.Random, n: int
) -> dict[str, Any]:
    """A master commit (``kind`` on ``table``), applied to ``rows`` (the master as the
    plan knows it) too, so that later changes pick keys that exist or do not."""
    key = "mk" if table == "m" else "pid"
    present = sorted({r[key] for r in rows})
    pool = ALL_KEYS if table == "m" else range(1, 8)
    absent = [k for k in pool if k not in present] or [max(present, default=0) + 1]

    def new_row(k: int, tag: str) -> dict[str, Any]:
        if table == "m":
            return {"mk": k, "name": f"m{k}{tag}{n}"}
        lo = rng.randint(0, 10)
        return {"pid": k, "lo": lo, "hi": lo + rng.randint(1, 4), "pname": f"p{k}{tag}{n}"}

    if kind == "append":
        added = [new_row(k, "a") for k in rng.sample(absent, min(len(absent), rng.randint(1, 2)))]
        added += [new_row(added[0][key], "a2")] if rng.random() < 0.5 else []
        rows += added
        return {"table": table, "op": "append", "rows": added}
    if kind == "overwrite":
        keys = rng.sample(list(pool), rng.randint(3, min(6, len(pool))))
        fresh = [new_row(k, "o") for k in keys]
        rows[:] = fresh
        return {"table": table, "op": "overwrite", "rows": fresh}
    # MERGE: update every row of one key, delete another, insert one absent key.
    chosen = rng.sample(present, min(2, len(present)))
    source = []
    if chosen:
        updated = {**new_row(chosen[0], "u"), "op": "update"}
        source.append(updated)
        rows[:] = [
            {**r, **{c: v for c, v in updated.items() if c not in (key, "op")}}
            if r[key] == chosen[0]
            else r
            for r in rows
        ]
    if len(chosen) > 1:
        source.append({**new_row(chosen[1], "d"), "op": "delete"})
        rows[:] = [r for r in rows if r[key] != chosen[1]]
    inserted = {**new_row(rng.choice(absent), "i"), "op": "insert"}
    source.append(inserted)
    rows.append({c: v for c, v in inserted.items() if c != "op"})
    return {"table": table, "op": "merge", "rows": source}


def apply_master_change(plan: TrialPlan, index: int, change: dict[str, Any]) -> None:
    """Commit a plan's master change with deltalake, once (a marker per command index:
    the worker restarted after a kill elsewhere resumes after it). On the object store
    deltalake commits with a conditional PUT, as the pipeline's own writers do."""
    marker = Path(plan.root) / "master_changes" / str(index)
    if marker.exists():
        return
    table = change["table"]
    schema = MASTER_SCHEMAS[table]
    path = f"{plan.warehouse}/masters/{table}"
    options = storage_options(path)
    rows = change["rows"]
    if change["op"] in ("append", "overwrite"):
        data = pa.Table.from_pylist(rows, schema=schema)
        write_deltalake(path, data, mode=change["op"], storage_options=options)
    else:
        source = pa.Table.from_pylist(rows, schema=schema.append(pa.field("op", pa.string())))
        key = schema.names[0]
        values = schema.names[1:]
        (
            DeltaTable(path, storage_options=options)
            .merge(source, f"t.{key} = s.{key}", source_alias="s", target_alias="t")
            .when_matched_delete(predicate="s.op = 'delete'")
            .when_matched_update(updates={c: f"s.{c}" for c in values})
            .when_not_matched_insert(
                updates={c: f"s.{c}" for c in schema.names}, predicate="s.op = 'insert'"
            )
            .execute()
        )
    marker.parent.mkdir(exist_ok=True)
    marker.write_text(str(DeltaTable(path, storage_options=options).version()))


def record_master_versions(plan: TrialPlan, index: int) -> None:
    """Log the version of each master in force for command ``index``, and keep that
    version's rows (read now, while the version is current: a vacuum may remove its files
    later). A rerun after a kill logs again; the last attempt's is the one that counts."""
    root = Path(plan.root)
    log_path = root / VERSIONS_FILE
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    entry = {}
    for name in MASTER_SCHEMAS:
        path = f"{plan.warehouse}/masters/{name}"
        options = storage_options(path)
        version = DeltaTable(path, storage_options=options).version()
        entry[name] = version
        kept = root / MASTER_ROWS_DIR / f"{name}@{version}.json"
        if not kept.exists():
            kept.parent.mkdir(exist_ok=True)
            rows = DeltaTable(path, version=version, storage_options=options)
            _write_atomically(kept, json.dumps(rows.to_pyarrow_table().to_pylist()))
    log[str(index)] = entry
    _write_atomically(log_path, json.dumps(log))


def stream_attempts(root: Path) -> list[dict[str, Any]]:
    """The ``enrich stream`` starts of the trial at ``root`` so far, as the worker recorded
    them (:data:`STREAM_LOG`): crash armed, exit code, intervals delivered while it ran,
    clock micro-batches."""
    path = root / STREAM_LOG
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def deliver(plan: TrialPlan, interval: int) -> None:
    """Put an interval's outbox files into the landing zone; idempotent."""
    root = Path(plan.root)
    if plan.bucket is not None:
        _deliver_to_store(root, ObjectLocation.parse(plan.landing), interval)
        return
    landing = root / "landing"
    for source in sorted((root / "outbox" / str(interval)).iterdir()):
        name = source.name
        if name.startswith("redeliver__"):
            target = landing / name.removeprefix("redeliver__")
            target.write_bytes(source.read_bytes())  # same bytes under the same name again
            continue
        if name.endswith(".symlink"):
            target = landing / name.removesuffix(".symlink")
            if not target.is_symlink():
                target.symlink_to(source.read_text())
            continue
        target = landing / name
        if not target.exists():
            partial = landing / f".{name}.part"
            partial.write_bytes(source.read_bytes())
            os.replace(partial, target)


def _deliver_to_store(root: Path, landing: ObjectLocation, interval: int) -> None:
    """Put an interval's outbox files into an object-store landing zone, as a producer
    does: one PUT per file (atomic: no temporary name), a re-delivery PUT again under the
    same key, an in-progress file started as a multipart upload that is given its bytes as
    a part and never completed. Idempotent, as :func:`deliver` is."""
    client = ObjectStore.from_environment().client()
    bucket = landing.bucket
    for source in sorted((root / "outbox" / str(interval)).iterdir()):
        name = source.name
        if name.endswith(".symlink"):
            raise ValueError(f"{source}: an object store has no symlinks; the plan has one")
        if name.startswith("redeliver__"):
            key = f"{landing.key}/{name.removeprefix('redeliver__')}"
            client.put_object(Bucket=bucket, Key=key, Body=source.read_bytes())
            continue
        if name.startswith(IN_PROGRESS_PREFIX):
            # An ordinary name: it is the unfinished upload, not its name, that the
            # pipeline must not read.
            key = f"{landing.key}/{name.removeprefix('_')}"
            started = client.list_multipart_uploads(Bucket=bucket, Prefix=key)
            if not any(u["Key"] == key for u in started.get("Uploads", [])):
                upload = client.create_multipart_upload(Bucket=bucket, Key=key)
                client.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload["UploadId"],
                    PartNumber=1,
                    Body=source.read_bytes(),
                )
            continue
        key = f"{landing.key}/{name}"
        if object_stamp(ObjectLocation(bucket, key).url()) is None:
            client.put_object(Bucket=bucket, Key=key, Body=source.read_bytes())


# --------------------------------------------------------------------------- the oracle


@dataclass(frozen=True)
class TrialCheck:
    seed: int
    engine: str
    state_store: str
    mode: str
    rows_checked: int
    lost: int
    duplicated: int
    problems: tuple[str, ...]
    storage: str = "local"
    # On the object store: the tables (below the warehouse root) whose log is in the bucket.
    tables_on_store: tuple[str, ...] = ()
    stream: bool = False
    # A stream trial: the landing files of its streamed intervals the stream's micro-batches
    # loaded (all of them, or check_trial says which were not).
    streamed_files: int = 0


# Tables every trial writes (the quarantines, operator state and late tables only when it
# has rows for them): on the object store each must have its log in the trial's bucket.
TABLES = (
    "masters/m",
    "masters/p",
    "bronze/s",
    "silver/out",
    "silver/outp",
    "gold/out",
    "gold/outp",
)


@dataclass(frozen=True)
class StreamTuple:
    """A stream record bronze must hold, and where it arrived."""

    id: int
    k: int
    v: str
    interval: int
    arrival: int  # the index of the command (the interval's run) that ingests it


@dataclass(frozen=True)
class Outcome:
    """One way the contract allows a stage to answer a tuple: joined with the master as
    of ``version`` (``unmatched``: one unmatched row, its wait over), or still waiting in
    the stage's late table at the end (``version`` None)."""

    version: int | None
    unmatched: bool = False

    @property
    def waiting(self) -> bool:
        return self.version is None


@dataclass(frozen=True)
class StageSpec:
    name: str
    output: str
    master: str
    columns: tuple[str, ...]  # the master's columns as the output carries them
    late: bool
    short_wait: bool
    in_state: bool = False  # SSBJ keeps the waiting tuples in its state (joins/ssbj/late.py)


def check_trial(root: Path) -> TrialCheck:
    """Compare bronze, the quarantines, silver, gold and the late table with the oracle."""
    plan = TrialPlan.load(root)
    tuples, malformed, resent, conflicts = _delivered_records(plan)
    wh = plan.warehouse
    counts = _Counts()
    on_store: tuple[str, ...] = ()
    if plan.bucket is not None:
        on_store = tables_on_store(plan.bucket)
        counts.problems += _placement_problems(plan, on_store)
    counts.compare(
        "bronze",
        Counter((t.id, t.k, t.v) for t in tuples),
        Counter(_rows_of(f"{wh}/bronze/s", ["id", "k", "v"])),
    )
    expected_quarantine = Counter(("bad", _record_key(line)) for line in malformed)
    expected_quarantine += Counter(("re-sent", f"v={r['v']}") for r in resent)
    expected_quarantine += Counter(("conflict", f"v={r['v']}") for r in conflicts)
    counts.compare(
        "quarantine",
        expected_quarantine,
        Counter(
            (_reason_kind(reason), _record_key(record))
            for record, reason in _rows_of(f"{wh}/quarantine/s", ["record", "reason"])
        ),
    )
    streamed_files = 0
    if plan.stream:
        streamed_files, problems = _stream_loads(plan)
        counts.problems += problems
        # The stream's own count of the micro-batches that did work (a start that stopped
        # by itself prints it): the first of a process always works, since it ingests
        # what landed while no stream ran. (Not the clock's checkpoint commits: a stop
        # right after a micro-batch may interrupt its commit, and the next start replays it.)
        counts.problems += [
            f"stream: start {a['attempt']} exited {a['exit']} after {a['micro_batches']} "
            "micro-batch(es); the first of a process always runs"
            for a in stream_attempts(root)
            if a["exit"] == 0 and not a["micro_batches"]
        ]
    versions = {int(c): v for c, v in json.loads((root / VERSIONS_FILE).read_text()).items()}
    con = duckdb.connect()
    con.register("s", pa.Table.from_pylist([asdict(t) for t in tuples], schema=_TUPLES_ARROW))
    for name, schema in MASTER_SCHEMAS.items():
        rows = []
        for version in sorted({v[name] for v in versions.values()}):
            kept = json.loads((root / MASTER_ROWS_DIR / f"{name}@{version}.json").read_text())
            rows += [{**r, "_ver": version} for r in kept]
        con.register(
            f"{name}_all",
            pa.Table.from_pylist(rows, schema=schema.append(pa.field("_ver", pa.int64()))),
        )
    late = plan.late_wait is not None
    stages = (
        StageSpec(
            "enrich",
            "out",
            "m",
            ("mk", "name"),
            late,
            plan.late_wait == "1s",
            in_state=late and plan.mode == "ssbj",
        ),
        StageSpec("promo", "outp", "p", ("pid", "lo", "hi", "pname"), False, False),
    )
    for stage in stages:
        _check_stage(con, plan, stage, tuples, versions, counts)
    for table in ("out", "outp"):
        counts.compare(
            f"output quarantine {table}",
            Counter(),
            Counter({"rows": _count_of(f"{wh}/quarantine/_outputs/{table}")}),
        )
    return TrialCheck(
        plan.seed,
        plan.engine,
        plan.state_store,
        plan.mode + (f"+late {plan.late_wait}" if late else ""),
        counts.checked,
        counts.lost,
        counts.duplicated,
        tuple(counts.problems),
        plan.storage,
        on_store,
        plan.stream,
        streamed_files,
    )


def _stream_loads(plan: TrialPlan) -> tuple[int, list[str]]:
    """How many files of the streamed intervals the stream's micro-batches loaded, and a
    problem for each that a scheduled run loaded instead, or that nothing loaded.

    The oracle answers a streamed interval's tuples from the version in force at the
    ``stream`` command; that holds only if the stream loaded them (a later run may be past a
    master commit). The landing ledger says which run registered each file. A file counts
    by its content, as the zone loads it: of the names that carry the same bytes (the same
    content under a new name) the one registered first is loaded, the others are
    duplicates; whether its rows reached bronze once is the bronze check's business."""
    from warehouse.state_store import StateStore

    root = Path(plan.root)
    url = yaml.safe_load((root / "config.yaml").read_text())["warehouse"]["state_store"]
    store = StateStore(url)
    try:
        loaded = {Path(f.path).name: f.run_id for f in store.landing_files("s", "loaded")}
    finally:
        store.dispose()
    names: dict[bytes, list[str]] = defaultdict(list)  # content -> its names in the zone
    streamed: list[tuple[int, bytes]] = []  # content first delivered in a streamed interval
    for interval in range(plan.intervals):
        for source in sorted((root / "outbox" / str(interval)).iterdir()):
            if _never_loaded(source.name):
                continue
            content = source.read_bytes()
            if content not in names and interval in plan.streamed:
                streamed.append((interval, content))
            names[content].append(source.name)
    problems = []
    for interval, content in streamed:
        runs = {name: loaded[name] for name in names[content] if name in loaded}
        if len(runs) == 1 and (next(iter(runs.values())) or "").startswith(STREAM_RUN_PREFIX):
            continue
        problems.append(
            f"stream: {names[content][0]} of streamed interval {interval} was loaded by "
            f"{runs or 'no run'}, not once by a micro-batch of the stream"
        )
    return len(streamed) - len(problems), problems


def _never_loaded(name: str) -> bool:
    """An outbox file the zone never loads: an identical re-delivery (of a name already
    delivered), a file that is not UTF-8 or has an unexpected column, a symlink, an
    in-progress file."""
    return name.startswith(("redeliver__", "_", "latin1_", "drift_")) or name.endswith(".symlink")


def tables_on_store(bucket: str) -> tuple[str, ...]:
    """The tables below ``s3://<bucket>/wh`` that have a ``_delta_log`` object, by their
    path below the root (``bronze/s``), sorted."""
    client = ObjectStore.from_environment().client()
    found: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="wh/"):
        for item in page.get("Contents", []):
            table, marker, _ = str(item["Key"]).removeprefix("wh/").partition("/_delta_log/")
            if marker:
                found.add(table)
    return tuple(sorted(found))


def _placement_problems(plan: TrialPlan, on_store: tuple[str, ...]) -> list[str]:
    """What shows that an object-store trial did not keep its data in its bucket: a table
    without a log there, a table or landing file on local disk, or a producer's unfinished
    upload that was completed or aborted (the pipeline must leave it alone)."""
    assert plan.bucket is not None
    root = Path(plan.root)
    problems = [
        f"table {t}: no _delta_log in bucket {plan.bucket}" for t in TABLES if t not in on_store
    ]
    local = sorted(str(p.relative_to(root)) for p in root.rglob("_delta_log"))
    local += [name for name in ("wh", "landing") if (root / name).exists()]
    if local:
        problems.append(f"object-store trial wrote tables or landing files locally: {local[:5]}")
    landing = ObjectLocation.parse(plan.landing)
    planned = {
        f"{landing.key}/{source.name.removeprefix('_')}"
        for interval in range(plan.intervals)
        for source in (root / "outbox" / str(interval)).iterdir()
        if source.name.startswith(IN_PROGRESS_PREFIX)
    }
    client = ObjectStore.from_environment().client()
    listed = client.list_multipart_uploads(Bucket=plan.bucket, Prefix=f"{landing.key}/")
    unfinished = {
        str(u["Key"])
        for u in listed.get("Uploads", [])
        if not str(u["Key"]).removeprefix(f"{landing.key}/").startswith(("_", "."))
    }
    if unfinished != planned:
        problems.append(
            f"unfinished uploads in the landing zone: {sorted(unfinished)}, planned "
            f"{sorted(planned)}"
        )
    return problems


class _Counts:
    """Rows checked, lost and duplicated, and what differed, over a trial's tables."""

    def __init__(self) -> None:
        self.checked = self.lost = self.duplicated = 0
        self.problems: list[str] = []

    def compare(self, table: str, expected: Counter[Any], got: Counter[Any]) -> None:
        missing, extra = expected - got, got - expected
        self.checked += sum(got.values())
        self.lost += sum(missing.values())
        self.duplicated += sum(extra.values())
        if missing or extra:
            self.problems.append(
                f"{table}: {sum(missing.values())} missing {sorted(missing, key=str)[:3]}, "
                f"{sum(extra.values())} extra {sorted(extra, key=str)[:3]}"
            )


def _allowed(
    plan: TrialPlan,
    stage: StageSpec,
    t: StreamTuple,
    versions: dict[int, dict[str, int]],
    has_key: dict[int, bool],
) -> list[Outcome]:
    """The outcomes the contract allows ``stage`` for tuple ``t`` (``has_key``: whether
    the master as of each version has rows for ``t``'s key).

    - A live step joins a tuple with the master version in force at that step (its plan
      pins it): the step of the run that ingested it, ``V(arrival)``. SSBJ pins a tuple
      to the version in force when it entered and answers it from that version however
      many steps it waits (``pipeline/ssbj/``), so the same rule holds.
    - With late_master, a tuple whose key has no row at its arrival waits: it is answered
      by the first later step (run or drain) whose version has its key, from that version;
      with a short wait it may instead expire unmatched at any step before that one (its
      version recorded), or still wait at the end if no version ever had its key.
    - A ``stream`` command is one step kind more: each of its micro-batches steps every
      stage at the version logged before it, so a tuple it delivers arrives there, and a
      short wait may expire in one of its later micro-batches.
    - A backfill of the tuple's interval re-joins it with the master in force at the
      backfill (``_master_as_of`` falls back to the latest version: every master commit
      is later than the trial's 2024 intervals), unless the tuple was still waiting for a
      late master row then (the live steps answer those, once).
    - SSBJ keeps a waiting tuple in its state (``stage.in_state``): it returns at a step
      whose version is newer than the one it last met no row at and spends an R-cycle
      against it, so it may be answered from any later step's version that has its key
      (not only the first), or still wait at the end (a version that had its key came
      while its cycle ran, and the final drain ended with its cycle). A backfill leaves it
      to the live steps if it waited then, or answers it if its first cycle still ran.
    """
    steps = [c for c, command in enumerate(plan.commands) if command.kind in STEP_KINDS]
    backfills = [
        c
        for c, command in enumerate(plan.commands)
        if command.kind == "backfill" and c > t.arrival and _covers(command, t.interval)
    ]
    master = stage.master

    def rejoined(answered_at: int, outcome: Outcome) -> Outcome:
        later = [b for b in backfills if b > answered_at]
        return Outcome(versions[later[-1]][master]) if later else outcome

    arrival_version = versions[t.arrival][master]
    if not stage.late or has_key[arrival_version]:
        return [rejoined(t.arrival, Outcome(arrival_version))]
    # The steps after the one it entered at. A stream command's later micro-batches are
    # steps too, at the version it arrived with (the masters change only between commands):
    # they cannot find its key, but may expire a short wait.
    probes = [
        c for c in steps if c > t.arrival or (c == t.arrival and plan.commands[c].kind == "stream")
    ]
    found = next((c for c in probes if has_key[versions[c][master]]), None)
    outcomes = []
    if stage.in_state:
        outcomes += [
            rejoined(c, Outcome(versions[c][master]))
            for c in probes
            if has_key[versions[c][master]]
        ]
        outcomes.append(Outcome(None))
        if backfills:  # it was still in its first cycle then: the backfill answered it
            outcomes.append(Outcome(versions[backfills[-1]][master]))
        if stage.short_wait:
            outcomes += [rejoined(c, Outcome(versions[c][master], unmatched=True)) for c in probes]
        return outcomes
    if found is not None:
        outcomes.append(rejoined(found, Outcome(versions[found][master])))
    else:
        outcomes.append(Outcome(None))
    if stage.short_wait:
        outcomes += [
            rejoined(c, Outcome(versions[c][master], unmatched=True))
            for c in probes
            if found is None or c < found
        ]
    return outcomes


def _covers(backfill: Command, interval: int) -> bool:
    start = datetime.fromisoformat(backfill.args[backfill.args.index("--start") + 1])
    end = datetime.fromisoformat(backfill.args[backfill.args.index("--end") + 1])
    return start <= BASE_TIME + timedelta(hours=interval) < end


def _check_stage(
    con: duckdb.DuckDBPyConnection,
    plan: TrialPlan,
    stage: StageSpec,
    tuples: list[StreamTuple],
    versions: dict[int, dict[str, int]],
    counts: _Counts,
) -> None:
    """Silver, gold and the late table of ``stage`` against the allowed outcomes."""
    condition = "s.k = m.mk" if stage.master == "m" else "m.lo <= s.k AND s.k < m.hi"
    all_versions = sorted({v[stage.master] for v in versions.values()})
    # Which versions have rows for each key (DuckDB, over every logged version).
    keyed = con.execute(
        f"SELECT s.id, v._ver, count(m._ver) > 0 FROM s CROSS JOIN "
        f"(SELECT unnest(?::BIGINT[]) AS _ver) v LEFT JOIN {stage.master}_all m "
        f"ON {condition} AND m._ver = v._ver GROUP BY s.id, v._ver",
        [all_versions],
    ).fetchall()
    has_key: dict[int, dict[int, bool]] = defaultdict(dict)
    for tuple_id, version, present in keyed:
        has_key[tuple_id][version] = bool(present)
    choices = [
        {"id": t.id, "alt": n, "ver": o.version, "unmatched": o.unmatched}
        for t in tuples
        for n, o in enumerate(_allowed(plan, stage, t, versions, has_key[t.id]))
    ]
    con.register(
        "choice",
        pa.Table.from_pylist(
            choices,
            schema=pa.schema(
                [
                    ("id", pa.int64()),
                    ("alt", pa.int64()),
                    ("ver", pa.int64()),
                    ("unmatched", pa.bool_()),
                ]
            ),
        ),
    )
    master_columns = ", ".join(f"m.{c}" for c in stage.columns)
    joined = con.execute(
        # An unmatched row records no master version (the version column comes with the
        # master's row, joins/baseline.py): m._ver is null there too.
        f"SELECT c.id, c.alt, c.ver, c.unmatched, s.k, s.v, {master_columns}, m._ver "
        "FROM choice c "
        f"JOIN s USING (id) LEFT JOIN {stage.master}_all m ON {condition} "
        "AND m._ver = c.ver AND NOT c.unmatched"
    ).fetchall()
    # Per tuple and alternative: (waits at the end, its rows, how the contract allows it).
    alternatives: dict[int, dict[int, tuple[bool, Counter[tuple[Any, ...]], str]]] = defaultdict(
        dict
    )
    for tuple_id, alt, version, unmatched, *row in joined:
        label = "waiting" if version is None else f"v{version}" + (" expired" if unmatched else "")
        _, rows, _ = alternatives[tuple_id].setdefault(alt, (version is None, Counter(), label))
        if version is not None:
            rows[(tuple_id, *row)] += 1
    columns = ["id", "k", "v", *stage.columns, f"_version_{stage.master}"]
    wh = plan.warehouse
    silver = _by_id(_rows_of(f"{wh}/silver/{stage.output}", columns))
    gold = _by_id(_rows_of(f"{wh}/gold/{stage.output}", columns))
    operator = f"{wh}/_operators/{stage.name}"
    if stage.in_state:
        kept = _rows_of(f"{operator}/state", ["_role", "s__id"])
        waiting = Counter(tuple_id for role, tuple_id in kept if role == "late")
    else:
        waiting = Counter(r[0] for r in _rows_of(f"{operator}/late", ["id"]))
    expected: dict[str, Counter[Any]] = {"silver": Counter(), "gold": Counter(), "late": Counter()}
    wrong: list[str] = []
    for tuple_id, alts in alternatives.items():
        found = silver.get(tuple_id, Counter())
        waits = waiting.get(tuple_id, 0)
        fits = [(w, rows) for w, rows, _ in alts.values() if rows == found and waits == int(w)]
        chosen_waiting, chosen = fits[0] if fits else next(iter(alts.values()))[:2]
        if not fits:
            allowed = [label for _, _, label in alts.values()]
            wrong.append(
                f"id {tuple_id}: found versions {sorted({r[-1] for r in found}, key=str)}"
                f"{' (waiting)' if waits else ''} x{sum(found.values())}, allowed {allowed}"
            )
        expected["silver"] += chosen
        expected["gold"] += chosen
        expected["late"][tuple_id] += int(chosen_waiting)
    found_all = {
        "silver": sum(silver.values(), Counter()),
        "gold": sum(gold.values(), Counter()),
        "late": waiting,
    }
    for table in ("silver", "gold", "late"):
        counts.compare(f"{stage.name} {table}", expected[table], found_all[table])
    if wrong:
        counts.problems.append(
            f"{stage.name}: {len(wrong)} tuple(s) not as the contract allows: "
            + "; ".join(wrong[:3])
        )


def _by_id(rows: Iterable[tuple[Any, ...]]) -> dict[int, Counter[tuple[Any, ...]]]:
    grouped: dict[int, Counter[tuple[Any, ...]]] = defaultdict(Counter)
    for row in rows:
        grouped[row[0]][row] += 1
    return grouped


def _record_key(record: str) -> str:
    """A quarantined record's identity: its ``v`` value, or the whole text if it has none.

    Records that do not parse are kept verbatim; records with a null required column (and
    re-sent records) are re-serialised by Spark, so only their values can be compared with
    the source line.
    """
    found = re.search(r'"v": ?"([^"]*)"', record)
    return f"v={found.group(1)}" if found else record


def _reason_kind(reason: str) -> str:
    for kind in ("re-sent", "conflict"):
        if reason.startswith(f"{kind}: "):
            return kind
    return "bad"


_TUPLES_ARROW = pa.schema(
    [
        ("id", pa.int64()),
        ("k", pa.int64()),
        ("v", pa.string()),
        ("interval", pa.int64()),
        ("arrival", pa.int64()),
    ]
)


def _delivered_records(
    plan: TrialPlan,
) -> tuple[list[StreamTuple], list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Records a correct pipeline loads, the raw malformed lines it quarantines, and the
    re-sent and conflicting records it quarantines (``warehouse/record_identity.py``: an
    id is loaded from the first file carrying it; a later record with the same id is a
    re-send if every column is equal, else a conflict)."""
    root = Path(plan.root)
    # A streamed interval arrives at its stream command (check_trial checks that the stream's
    # micro-batches loaded its files), any other at its run.
    runs = {c.interval: i for i, c in enumerate(plan.commands) if c.kind == "run"}
    runs.update(plan.streamed)
    good: list[StreamTuple] = []
    first: dict[int, dict[str, Any]] = {}
    malformed: list[str] = []
    resent: list[dict[str, Any]] = []
    conflicts: list[dict[str, Any]] = []
    seen: set[bytes] = set()
    for interval in range(plan.intervals):
        for source in sorted((root / "outbox" / str(interval)).iterdir()):
            content = source.read_bytes()
            if _never_loaded(source.name) or content in seen:
                continue
            seen.add(content)
            for line in content.decode().splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    malformed.append(line)
                    continue
                if (
                    not isinstance(record, dict)
                    or not isinstance(record.get("id"), int)
                    or not isinstance(record.get("k"), int)
                ):
                    malformed.append(line)
                    continue
                known = first.get(record["id"])
                if known is not None:
                    (resent if known == record else conflicts).append(record)
                    continue
                first[record["id"]] = record
                good.append(
                    StreamTuple(record["id"], record["k"], record["v"], interval, runs[interval])
                )
    return good, malformed, resent, conflicts


def _table(location: str) -> DeltaTable | None:
    """The Delta table at ``location`` (a folder or an ``s3://`` location; on the store with
    the environment's endpoint and credentials), None if none was created there."""
    options = storage_options(location)
    if not DeltaTable.is_deltatable(location, storage_options=options):
        return None
    return DeltaTable(location, storage_options=options)


def _rows_of(location: str, columns: list[str]) -> list[tuple[Any, ...]]:
    table = _table(location)
    if table is None:
        return []
    return [
        tuple(r[c] for c in columns) for r in table.to_pyarrow_table(columns=columns).to_pylist()
    ]


def _count_of(location: str) -> int:
    table = _table(location)
    return 0 if table is None else table.to_pyarrow_table().num_rows


def _write_masters(warehouse: str, rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """Masters m and p under ``warehouse`` (a folder or an ``s3://`` location), each in two
    commits; returns their rows."""
    m = [{"mk": k, "name": f"m{k}"} for k in INITIAL_KEYS]
    m += [{"mk": k, "name": f"m{k}b"} for k in INITIAL_KEYS if rng.random() < 0.4]
    p = [{"pid": i, "lo": lo, "hi": hi, "pname": n} for i, lo, hi, n in INITIAL_PROMOS]
    for name, rows in (("m", m), ("p", p)):
        table = pa.Table.from_pylist(rows, schema=MASTER_SCHEMAS[name])
        path = f"{warehouse}/masters/{name}"
        options = storage_options(path)
        half = len(rows) // 2
        write_deltalake(path, table.slice(0, half), storage_options=options)
        write_deltalake(path, table.slice(half), mode="append", storage_options=options)
    return {"m": m, "p": p}


def _rows(
    rng: random.Random, interval: int, first_id: int, count: int
) -> tuple[list[dict[str, Any]], int]:
    start = BASE_TIME + timedelta(hours=interval)
    rows = [
        {
            "id": first_id + i,
            "k": rng.choice(STREAM_KEYS),
            "v": f"v{first_id + i}",
            "ts": (start + timedelta(seconds=rng.randrange(3600))).strftime("%Y-%m-%dT%H:%M:%S"),
        }
        for i in range(count)
    ]
    return rows, first_id + count


def _malformed(rng: random.Random, interval: int) -> list[str]:
    ts = (BASE_TIME + timedelta(hours=interval)).strftime("%Y-%m-%dT%H:%M:%S")
    options = [
        '{"id": 77, "k": 1, "v": "trunc',
        f'{{"id": null, "k": 2, "v": "nullid", "ts": "{ts}"}}',
        "not json at all",
        f'{{"id": "abc", "k": 3, "v": "badtype", "ts": "{ts}"}}',
    ]
    return rng.sample(options, rng.randint(1, 3))


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines))


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.part")
    partial.write_text(text)
    os.replace(partial, path)
