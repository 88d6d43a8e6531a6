"""What a scheduled run costs: in-process Spark per task vs a warm Spark Connect server.

    python -m benchmarks.run_overhead [--scale 0.01] [--intervals 3]
                                      [--out benchmarks/results/run_overhead.md]

The demo pipeline (configs/demo.yaml: two SSBJ stages, one A-DSP stage, quality gates on
all three outputs) runs the same generated TPC-H data in four ways, one after the other,
each in a fresh copy of the same warehouse:

- ``tasks, in-process``: every task of a DAG run (``ingest``, one ``stage`` per stage,
  ``validate``) is its own ``enrich`` process that starts its own Spark, as an Airflow
  executor runs tasks;
- ``tasks, Connect``: the same processes with ``SPARK_REMOTE`` set to a Spark Connect server
  started once beforehand (``ConnectServer``, what ``enrich spark-server`` runs; its start-up
  is reported separately);
- ``dag.test(), in-process`` and ``dag.test(), Connect``: the generated DAG through Airflow's
  ``dag.test()``, all intervals in one process (as ``make demo`` runs it).

Per interval it reports the wall time of the DAG run's tasks, and per task the phases the
pipeline itself recorded (``task.*`` metrics: session start, write, commit, validate,
other). It also times ``enrich status`` and a misspelled stage name (neither starts Spark).
Intervals after the first are the steady state of a scheduled pipeline. The modes run in
a fixed order, in-process first; every mode must publish the same rows, or the run fails.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DEMO_CONFIG = REPO / "configs" / "demo.yaml"
logger = logging.getLogger("run_overhead")


@dataclass(frozen=True)
class Manifest:
    """The generated intervals (``var/demo/outbox/manifest.json``)."""

    streams: list[str]
    intervals: list[str]
    interval_seconds: int

    def as_json(self) -> str:
        return json.dumps(
            {
                "streams": self.streams,
                "intervals": self.intervals,
                "interval_seconds": self.interval_seconds,
            }
        )


@dataclass
class ModeResult:
    mode: str
    interval_seconds: list[float] = field(default_factory=list)
    task_phases: dict[str, dict[str, float]] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    """Rows of every table under ``gold/`` at the end: the modes must agree."""


def published_rows(folder: Path) -> dict[str, int]:
    from deltalake import DeltaTable

    gold = folder / "var/demo/warehouse/gold"
    return {p.name: DeltaTable(str(p)).count() for p in sorted(gold.iterdir())}


def enrich(
    folder: Path, *argv: str, remote: str | None = None, expect: tuple[int, ...] = (0, 3)
) -> float:
    """Run one ``enrich`` command in its own process in ``folder``; its wall seconds.

    ``expect``: the exit codes that count as done (3: a quality gate quarantined a batch,
    which is still work done and timed).
    """
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    if remote:
        env["SPARK_REMOTE"] = remote
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "jobs.enrich", "--config", "demo.yaml", *argv],
        cwd=folder,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    seconds = time.perf_counter() - started
    if done.returncode not in expect:
        raise RuntimeError(
            f"expected exit {expect} from enrich {' '.join(argv)} in {folder}, got "
            f"{done.returncode}: {done.stderr[-3000:]}"
        )
    return seconds


def prepare(seed: Path, scale: float, intervals: int) -> Manifest:
    """Generate the demo data once under ``seed``; the manifest of its intervals."""
    shutil.rmtree(seed, ignore_errors=True)
    seed.mkdir(parents=True)
    raw = yaml.safe_load(DEMO_CONFIG.read_text())
    raw["expectations_dir"] = str(REPO / "expectations")
    (seed / "demo.yaml").write_text(yaml.safe_dump(raw))
    start = "2024-01-01T00:00:00+00:00"
    enrich(
        seed, "demo-data", "--scale", str(scale), "--intervals", str(intervals), "--start", start
    )
    raw = json.loads((seed / "var/demo/outbox/manifest.json").read_text())
    return Manifest(list(raw["streams"]), list(raw["intervals"]), int(raw["interval_seconds"]))


def deliver_interval(folder: Path, manifest: Manifest, index: int) -> None:
    from demo.data import deliver
    from pipeline.config import parse_config

    # The raw config: load_config would anchor the relative landing paths at this process's
    # working directory, not at the mode's folder.
    streams = parse_config(yaml.safe_load((folder / "demo.yaml").read_text())).streams
    outbox = folder / "var/demo/outbox"
    for stream in manifest.streams:
        deliver(outbox, stream, index, folder / streams[stream].landing)


def task_phases(folder: Path, run_prefix: str) -> dict[str, dict[str, float]]:
    """``{task: {phase: seconds}}`` summed over the runs whose id starts with the prefix."""
    from warehouse.state_store import StateStore

    store = StateStore(f"sqlite:///{folder / 'var/demo/warehouse/_state/pipeline.db'}")
    try:
        phases: dict[str, dict[str, float]] = {}
        for metric in store.metrics():
            if metric.stage.startswith("task.") and metric.run_id.startswith(run_prefix):
                task = phases.setdefault(metric.stage.removeprefix("task."), {})
                name = metric.name.removeprefix("seconds.")
                task[name] = task.get(name, 0.0) + metric.value
        return phases
    finally:
        store.dispose()


def run_tasks(
    seed: Path, folder: Path, manifest: Manifest, remote: str | None, name: str
) -> ModeResult:
    """Every task of every interval as its own ``enrich`` process."""
    from pipeline.config import load_config

    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(seed, folder)
    stages = [s.name for s in load_config(folder / "demo.yaml").stages]
    result = ModeResult(name)
    step = timedelta(seconds=manifest.interval_seconds)
    for index, start_text in enumerate(manifest.intervals):
        deliver_interval(folder, manifest, index)
        start = datetime.fromisoformat(start_text).replace(tzinfo=UTC)
        window = ["--run-id", f"i{index}", "--start", start.isoformat()]
        window += ["--end", (start + step).isoformat()]
        seconds = enrich(folder, "ingest", *window, remote=remote)
        for stage in stages:
            seconds += enrich(folder, "stage", stage, *window, remote=remote)
        seconds += enrich(folder, "validate", *window, remote=remote)
        logger.info("%s: interval %d in %.1fs", name, index, seconds)
        result.interval_seconds.append(seconds)
    result.task_phases = task_phases(folder, "i")
    result.rows = published_rows(folder)
    return result


DAG_TEST_CHILD = """
import json, sys, time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from orchestration.airflow_env import prepare_airflow_home
folder = Path(sys.argv[1]); manifest = json.loads(sys.argv[2])
prepare_airflow_home(folder / "airflow", folder / "dags")
from airflow.dag_processing.dagbag import DagBag
from benchmarks.run_overhead import Manifest, deliver_interval
dag = DagBag(dag_folder=str(folder / "dags")).get_dag("enrich_demo")
manifest = Manifest(**manifest)
step = timedelta(seconds=manifest.interval_seconds)
seconds = []
for index, start_text in enumerate(manifest.intervals):
    deliver_interval(folder, manifest, index)
    end = datetime.fromisoformat(start_text).replace(tzinfo=UTC) + step
    started = time.perf_counter()
    run = dag.test(logical_date=end)
    seconds.append(time.perf_counter() - started)
    assert "success" in str(run.state).lower(), f"DAG run for {end} ended {run.state}"
print("SECONDS " + json.dumps(seconds))
"""


def run_dag_test(
    seed: Path, folder: Path, manifest: Manifest, remote: str | None, name: str
) -> ModeResult:
    """All intervals through ``dag.test()`` in one child process."""
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(seed, folder)
    enrich(folder, "generate-dag", "--out", str(folder / "dags" / "enrich_demo.py"))
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REMOTE"}
    if remote:
        env["SPARK_REMOTE"] = remote
    done = subprocess.run(
        [sys.executable, "-c", DAG_TEST_CHILD, str(folder), manifest.as_json()],
        cwd=folder,
        env={**env, "PYTHONPATH": str(REPO)},
        check=False,
        capture_output=True,
        text=True,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("SECONDS ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name}: dag.test() child failed: {done.stderr[-3000:]}")
    result = ModeResult(name, json.loads(lines[-1].removeprefix("SECONDS ")))
    result.task_phases = task_phases(folder, "manual__")
    result.rows = published_rows(folder)
    return result


def render(
    results: Sequence[ModeResult],
    server_start: float,
    quick: dict[str, float],
    args: argparse.Namespace,
) -> str:
    intervals = len(results[0].interval_seconds)
    head = " | ".join(f"interval {i + 1}" for i in range(intervals))
    lines = [
        f"Demo pipeline, TPC-H SF {args.scale}, {intervals} hourly intervals, 2 cores; "
        f"seconds of all tasks of one DAG run (`python -m benchmarks.run_overhead "
        f"--scale {args.scale} --intervals {args.intervals}`).",
        "",
        f"| mode | {head} | steady state (median after the first) | tasks, in-process / mode |",
        "|---|" + "---|" * intervals + "---|---|",
    ]
    base = statistics.median(results[0].interval_seconds[1:] or results[0].interval_seconds)
    for r in results:
        steady = statistics.median(r.interval_seconds[1:] or r.interval_seconds)
        cells = " | ".join(f"{s:.1f}" for s in r.interval_seconds)
        lines.append(f"| {r.mode} | {cells} | {steady:.1f} | {base / steady:.2f}x |")
    lines += [
        "",
        f"Spark Connect server start-up (once, before the Connect modes): {server_start:.1f} s.",
        f"`enrich status`: {quick['status']:.1f} s; a misspelled stage name (exit 2): "
        f"{quick['bad stage']:.1f} s.",
        "",
        f"Every mode published the same rows: {results[0].rows}.",
        "",
        "Seconds per task summed over all intervals, by phase (the pipeline's own task "
        "metrics; `write` includes the read and join a lazy Spark plan runs inside it):",
        "",
    ]
    phases = sorted({p for r in results for t in r.task_phases.values() for p in t} - {"total"})
    lines.append("| mode | task | total | " + " | ".join(phases) + " |")
    lines.append("|---|---|---|" + "---|" * len(phases))
    for r in results:
        for task, values in sorted(r.task_phases.items()):
            cells = " | ".join(f"{values.get(p, 0.0):.1f}" for p in phases)
            lines.append(f"| {r.mode} | {task} | {values.get('total', 0.0):.1f} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=0.01)
    parser.add_argument("--intervals", type=int, default=3)
    parser.add_argument("--work", type=Path, default=REPO / "var" / "bench" / "run_overhead")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/run_overhead.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
    from warehouse.connect_address import RemoteAddress
    from warehouse.connect_server import ConnectServer, ConnectServerSettings, free_port

    seed = args.work / "seed"
    manifest = prepare(seed, args.scale, args.intervals)
    quick = {
        "status": enrich(seed, "status"),
        "bad stage": enrich(seed, "stage", "no_such_stage", expect=(2,)),
    }
    results = [run_tasks(seed, args.work / "tasks-local", manifest, None, "tasks, in-process")]
    results.append(
        run_dag_test(seed, args.work / "dag-local", manifest, None, "dag.test(), in-process")
    )
    settings = ConnectServerSettings(
        address=RemoteAddress("127.0.0.1", free_port()),
        conf=yaml.safe_load(DEMO_CONFIG.read_text())["spark"]["conf"],
        log_file=args.work / "connect-server.log",
    )
    started = time.perf_counter()
    with ConnectServer(settings) as server:
        server_start = time.perf_counter() - started
        results.append(
            run_tasks(seed, args.work / "tasks-connect", manifest, server.url, "tasks, Connect")
        )
        results.append(
            run_dag_test(
                seed, args.work / "dag-connect", manifest, server.url, "dag.test(), Connect"
            )
        )
    for r in results:  # a mode that published other rows did other work: not comparable
        if r.rows != results[0].rows or not any(r.rows.values()):
            raise RuntimeError(
                f"{r.mode} published {r.rows}, {results[0].mode} published {results[0].rows}"
            )
    table = render(results, server_start, quick, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
