"""One soak trial: its seeded plan, its landing files, and its DuckDB oracle (no Spark here).

A trial is a small pipeline (stream ``s`` of JSON files, master ``m``, one left equi join
``enrich`` -> ``out``: SSBJ for even seeds, the plain join per batch for odd ones) run over
a few hourly intervals by a list of commands:

    deliver i, run, validate            for every interval i
    backfill [b, b+1h)                  once, after a random interval
    drain, validate                     at the end

Each interval delivers good files and, at random, the faults a producer causes: malformed
records, glob-looking names beside their twins, a file that is not UTF-8, a file with an
unexpected column, the same content under a new name, an identical re-delivery, a symlink
to a file outside the zone, an in-progress file. One command of the trial is armed to
SIGKILL itself at a random crash point (a named point, or the n-th Delta commit before or
after it lands); the worker is restarted at that command.

The oracle is DuckDB SQL over the files the trial wrote and the master: expected bronze
rows, expected ingest-quarantine records, and the expected left join, which silver and gold
must both equal as multisets.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import yaml
from deltalake import DeltaTable, write_deltalake

BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)
MASTER_KEYS = range(1, 9)
# Keys 9 and 10 have no master row (left join emits them unmatched); some keys have 2 rows.
STREAM_KEYS = [1, 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10]
NAMED_POINTS = (
    "ssbj.after_output",
    "ssbj.before_complete",
    "stage.after_output_commit",
    "audit.before_publish",
    "audit.after_publish",
)
COMMIT_POINTS = ("delta.before_commit", "delta.after_commit")
# Exit codes a command may end with in a correct run (4: rejected files still in place).
ALLOWED_EXIT = {"run": (0, 4), "validate": (0,), "backfill": (0,), "drain": (0,)}


@dataclass(frozen=True)
class Command:
    kind: str
    interval: int = 0
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Crash:
    command: int
    point: str

    def env_value(self) -> str:
        return self.point


@dataclass
class TrialPlan:
    seed: int
    root: str
    intervals: int
    commands: list[Command]
    crash: Crash
    faults: list[str] = field(default_factory=list)

    def save(self) -> None:
        (Path(self.root) / "plan.json").write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(root: Path) -> TrialPlan:
        raw = json.loads((root / "plan.json").read_text())
        return TrialPlan(
            seed=raw["seed"],
            root=raw["root"],
            intervals=raw["intervals"],
            commands=[Command(c["kind"], c["interval"], tuple(c["args"])) for c in raw["commands"]],
            crash=Crash(**raw["crash"]),
            faults=raw["faults"],
        )


def config(root: Path, state_store: str | None = None, mode: str = "ssbj") -> dict[str, Any]:
    return {
        "name": "soak",
        "warehouse": {
            "root": str(root / "wh"),
            "state_store": state_store or f"sqlite:///{root / 'state.db'}",
            "engine": "embedded",
        },
        "spark": {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": "1"}},
        "schedule": {"interval": "1h", "start": BASE_TIME.isoformat()},
        "streams": {
            "s": {
                "landing": str(root / "landing"),
                "format": "json",
                "event_time": "ts",
                "id_column": "id",
                "columns": [
                    {"name": "id", "type": "bigint", "nullable": False},
                    {"name": "k", "type": "bigint"},
                    {"name": "v", "type": "string"},
                    {"name": "ts", "type": "timestamp", "nullable": False},
                ],
            }
        },
        "masters": {"m": {"table": "masters/m", "keys": ["mk"], "columns": ["mk", "name"]}},
        "stages": [
            {
                "name": "enrich",
                "kind": "equi",
                "input": "s",
                "master": "m",
                "join_on": {"k": "mk"},
                "join": "left",
                "output": "out",
                "operator": {"mode": mode, "partitions": 2, "steps_per_run": 1},
            }
        ],
    }


def make_trial(
    root: Path, seed: int, intervals: int = 2, state_store: str | None = None
) -> TrialPlan:
    """Write the trial's config, master and outbox files; return its plan.

    ``state_store`` is a SQLAlchemy URL (a PostgreSQL database, say); SQLite by default.
    """
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)

    # Odd seeds use the plain join per batch (no pending state; cheaper), even seeds SSBJ.
    mode = "ssbj" if seed % 2 == 0 else "baseline"
    (root / "config.yaml").write_text(yaml.safe_dump(config(root, state_store, mode)))
    (root / "landing").mkdir(exist_ok=True)
    _write_master(root, rng)
    faults: list[str] = []
    next_id = 1
    earlier: list[Path] = []
    for interval in range(intervals):
        outbox = root / "outbox" / str(interval)
        outbox.mkdir(parents=True, exist_ok=True)
        for n in range(rng.randint(1, 2)):
            rows, next_id = _rows(rng, interval, next_id, rng.randint(8, 20))
            bad = _malformed(rng, interval) if rng.random() < 0.5 else []
            if bad:
                faults.append(f"i{interval}: {len(bad)} malformed record(s)")
            path = outbox / f"good_{interval}_{n}.json"
            _write_lines(path, [json.dumps(r) for r in rows] + bad)
            earlier.append(path)
        if rng.random() < 0.5:
            rows, next_id = _rows(rng, interval, next_id, 5)
            _write_lines(outbox / f"g[{interval}].json", [json.dumps(r) for r in rows])
            rows, next_id = _rows(rng, interval, next_id, 5)
            _write_lines(outbox / f"g{interval}.json", [json.dumps(r) for r in rows])
            faults.append(f"i{interval}: glob-looking name beside its twin")
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
            outside = root / "outside.json"
            rows, _ = _rows(rng, interval, 990_000, 2)
            _write_lines(outside, [json.dumps(r) for r in rows])
            (outbox / f"link_{interval}.json.symlink").write_text(str(outside))
            faults.append(f"i{interval}: symlink to a file outside the zone")
        if rng.random() < 0.3:
            rows, _ = _rows(rng, interval, 980_000, 2)
            _write_lines(outbox / f"_inprogress_{interval}.json", [json.dumps(r) for r in rows])
            faults.append(f"i{interval}: in-progress file")
    commands: list[Command] = []
    backfill_after = rng.randrange(intervals)
    for interval in range(intervals):
        commands += [
            Command("deliver", interval),
            Command("run", interval, ("run", "--run-id", f"i{interval}")),
            Command("validate", interval, ("validate", "--run-id", f"i{interval}")),
        ]
        if interval == backfill_after:
            start = BASE_TIME + timedelta(hours=rng.randrange(interval + 1))
            commands.append(
                Command(
                    "backfill",
                    interval,
                    (
                        "backfill",
                        "--run-id",
                        f"bf{interval}",
                        "--start",
                        start.isoformat(),
                        "--end",
                        (start + timedelta(hours=1)).isoformat(),
                    ),
                )
            )
    commands += [
        Command("drain", intervals, ("drain", "--run-id", "final")),
        Command("validate", intervals, ("validate", "--run-id", "final")),
    ]
    armed = rng.choice([i for i, c in enumerate(commands) if c.kind != "deliver"])
    kind = commands[armed].kind
    stage_points = ("ssbj.",) if mode == "ssbj" else ("stage.",)
    points = [*COMMIT_POINTS] * 2 + [
        p
        for p in NAMED_POINTS
        if (p.startswith(stage_points) and kind in ("run", "drain"))
        or (p.startswith("audit") and kind in ("validate", "backfill"))
    ]
    point = rng.choice(points)
    # Delta commits per command here: a run ~8 (an SSBJ step commits twice), a drain ~4,
    # a backfill 2-3, a validate 1.
    most = {"run": 6, "drain": 3, "backfill": 2, "validate": 1}[kind]
    nth = rng.randint(1, most if point in COMMIT_POINTS else 2)
    plan = TrialPlan(seed, str(root), intervals, commands, Crash(armed, f"{point}:{nth}"), faults)
    plan.save()
    return plan


def deliver(root: Path, interval: int) -> None:
    """Move an interval's outbox files into the landing zone; idempotent."""
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


# --------------------------------------------------------------------------- the oracle


@dataclass
class TrialCheck:
    seed: int
    rows_checked: int
    lost: int
    duplicated: int
    problems: list[str]


def check_trial(root: Path) -> TrialCheck:
    """Compare bronze, the ingest quarantine, silver and gold with the DuckDB oracle."""
    plan = TrialPlan.load(root)
    good, malformed = _delivered_records(root, plan.intervals)
    con = duckdb.connect()
    con.register("s", pa.Table.from_pylist(good, schema=_STREAM_ARROW))
    con.register("m", DeltaTable(str(root / "wh" / "masters" / "m")).to_pyarrow_table())
    expected_join = Counter(
        con.execute(
            "SELECT s.id, s.k, s.v, m.mk, m.name FROM s LEFT JOIN m ON s.k = m.mk"
        ).fetchall()
    )
    expected_bronze = Counter((r["id"], r["k"], r["v"]) for r in good)
    expected_quarantine = Counter(_record_key(line) for line in malformed)
    wh = root / "wh"
    found: dict[str, Counter[Any]] = {
        "bronze": Counter(_rows_of(wh / "bronze" / "s", ["id", "k", "v"])),
        "quarantine": Counter(
            _record_key(r[0]) for r in _rows_of(wh / "quarantine" / "s", ["record"])
        ),
        "silver": Counter(_rows_of(wh / "silver" / "out", ["id", "k", "v", "mk", "name"])),
        "gold": Counter(_rows_of(wh / "gold" / "out", ["id", "k", "v", "mk", "name"])),
    }
    want: dict[str, Counter[Any]] = {
        "bronze": expected_bronze,
        "quarantine": expected_quarantine,
        "silver": expected_join,
        "gold": expected_join,
    }
    lost = duplicated = checked = 0
    problems = []
    for table, expected in want.items():
        got = found[table]
        missing, extra = expected - got, got - expected
        checked += sum(got.values())
        lost += sum(missing.values())
        duplicated += sum(extra.values())
        if missing or extra:
            problems.append(
                f"{table}: {sum(missing.values())} missing {list(missing)[:3]}, "
                f"{sum(extra.values())} extra {list(extra)[:3]}"
            )
    return TrialCheck(plan.seed, checked, lost, duplicated, problems)


def _record_key(record: str) -> str:
    """A quarantined record's identity: its ``v`` value, or the whole text if it has none.

    Records that do not parse are kept verbatim; records with a null required column are
    re-serialised by Spark, so only their values can be compared with the source line.
    """
    found = re.search(r'"v": ?"([^"]*)"', record)
    return f"v={found.group(1)}" if found else record


_STREAM_ARROW = pa.schema([("id", pa.int64()), ("k", pa.int64()), ("v", pa.string())])


def _delivered_records(root: Path, intervals: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Records a correct pipeline loads, and the raw malformed lines it quarantines."""
    good: list[dict[str, Any]] = []
    malformed: list[str] = []
    seen: set[bytes] = set()
    for interval in range(intervals):
        for source in sorted((root / "outbox" / str(interval)).iterdir()):
            name = source.name
            refused = name.startswith(("redeliver__", "_", "latin1_", "drift_")) or name.endswith(
                ".symlink"
            )
            content = source.read_bytes()
            if refused or content in seen:
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
                good.append({"id": record["id"], "k": record["k"], "v": record["v"]})
    return good, malformed


def _rows_of(path: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    if not (path / "_delta_log").exists():
        return []
    table = DeltaTable(str(path)).to_pyarrow_table(columns=columns)
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


def _write_master(root: Path, rng: random.Random) -> None:
    rows = [{"mk": k, "name": f"m{k}"} for k in MASTER_KEYS]
    rows += [{"mk": k, "name": f"m{k}b"} for k in MASTER_KEYS if rng.random() < 0.4]
    table = pa.Table.from_pylist(
        rows, schema=pa.schema([("mk", pa.int64()), ("name", pa.string())])
    )
    path = str(root / "wh" / "masters" / "m")
    half = len(rows) // 2
    write_deltalake(path, table.slice(0, half))
    write_deltalake(path, table.slice(half), mode="append")


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
