"""Airflow 3's own services on loopback run the pipeline: a scheduled run, then a backfill.

The test starts ``airflow api-server``, ``airflow scheduler`` and ``airflow dag-processor``
(LocalExecutor, the metadata database on the tests' PostgreSQL server), with the demo
pipeline trimmed to its orders stream and its first stage, and its DAG generated into the
services' DAG folder, beside a consumer DAG scheduled on the stage's ``complete`` Asset. The
stage runs SSBJ with k = 2 partitions, one step a run and a freshness bound of 2 intervals,
so a run answers half an R-cycle. The DAG starts and ends (``schedule.end``) at the last
complete hourly interval and catches up, so unpausing it through the REST API makes the
scheduler create exactly one run, for the interval the demo data was written for. The test
then checks, through the REST API:

- the run and every task of its live path succeeded, and the backfill task was skipped;
- the pipeline's own log lines (stage progress with tuple counts) are in the task logs the
  api-server serves;
- that run left part of its interval pending: its gold Asset event says the interval is not
  complete, its ``complete_orders_customer`` task was skipped, no ``complete`` event fired
  and the consumer did not run; a second (manual) run answers the rest, updates the
  ``complete`` Asset with that interval in its extra, and the consumer runs and sees it;
- ``airflow backfill create`` over the first interval turns that run into a run of type
  ``backfill`` that takes the backfill path (``enrich backfill``) and skips ingest, stages
  and validate;

and opens the runs in the Airflow UI with headless Chromium, keeping screenshots in
``var/screenshots/airflow-dag-run.png`` and ``airflow-backfill-run.png``. (A run's params
reaching the stage tasks as options is checked by ``dag.test(run_conf=...)`` in
``tests/dags/test_dag_runs.py``: a third run of four Spark tasks here cost minutes.)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from demo.data import deliver
from pipeline.config import parse_config
from tests.conftest import REPO_ROOT
from tests.postgres import PostgresServer
from warehouse.connect_server import free_port

pytestmark = pytest.mark.slow

DEMO_CONFIG = REPO_ROOT / "configs" / "demo.yaml"
DAG_ID = "enrich_demo"
SCREENSHOTS = REPO_ROOT / "var" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
ENRICH = [sys.executable, "-m", "jobs.enrich"]
RUN_TIMEOUT = 900.0
CONSUMER_ID = "complete_consumer"
GOLD = "enrich://demo/gold/orders_customer"
COMPLETE = f"{GOLD}/complete"
# A DAG that wants whole intervals of orders_customer: it records what each run was told.
CONSUMER_DAG = '''"""Runs when an interval of orders_customer became complete."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG

from orchestration.assets import complete_assets

SEEN = Path({seen!r})


def consume(triggering_asset_events=None, dag_run=None):
    with SEEN.open("a") as handle:
        for asset, events in triggering_asset_events.items():
            for event in events:
                seen = {{"run_id": dag_run.run_id, "uri": asset.uri, "extra": event.extra}}
                handle.write(json.dumps(seen) + "\\n")


with DAG(
    dag_id="{dag_id}",
    schedule=complete_assets("demo", ["orders_customer"]),
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    doc_md=__doc__,
):
    PythonOperator(task_id="consume", python_callable=consume)
'''


@dataclass
class Airflow:
    """The running services and a REST client for them."""

    url: str
    env: dict[str, str]
    logs: Path
    token: str = ""

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def cli(self, *argv: str) -> str:
        done = subprocess.run(
            [AIRFLOW, *argv], env=self.env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, f"airflow {' '.join(argv)}: {done.stderr[-3000:]}"
        return done.stdout

    def service_logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.logs.glob("*.log"))
        )

    def dag_runs(self, dag_id: str = DAG_ID) -> list[dict[str, Any]]:
        return list(self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=50")["dag_runs"])

    def asset_events(self, uri: str) -> list[dict[str, Any]]:
        """The events of the Asset ``uri``, oldest first."""
        found = self.request("GET", "/api/v2/assets/events?limit=100&order_by=timestamp")
        return [e for e in found["asset_events"] if e["uri"] == uri]

    def wait_for_run(self, predicate: Any, what: str, dag_id: str = DAG_ID) -> dict[str, Any]:
        deadline = time.monotonic() + RUN_TIMEOUT
        while time.monotonic() < deadline:
            runs = self.dag_runs(dag_id)
            chosen = [r for r in runs if predicate(r)]
            if chosen and chosen[0]["state"] in ("success", "failed"):
                return dict(chosen[0])
            time.sleep(3)
        raise AssertionError(f"no {what} finished in {RUN_TIMEOUT}s\n{self.service_logs()}")

    def task_states(self, run_id: str) -> dict[str, str]:
        found = self.request("GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")
        return {t["task_id"]: t["state"] for t in found["task_instances"]}

    def failures(self, run_id: str) -> str:
        """The states of a run's tasks and the logs of those that failed."""
        states = self.task_states(run_id)
        failed = [t for t, state in states.items() if state == "failed"]
        return f"{states}\n" + "\n".join(
            f"--- {t}\n{self.task_log(run_id, t)[-4000:]}" for t in failed
        )

    def task_log(self, run_id: str, task_id: str) -> str:
        found = self.request(
            "GET", f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1"
        )
        return json.dumps(found["content"])


def interval_start() -> dt.datetime:
    """The start of the last complete hourly interval. The DAG starts and ends there
    (``schedule.end``) and catches up: the scheduler creates a run for that interval and
    for no other, even when the hour turns during the test (with catchup off and no end, a
    test begun just before the hour had to wait it out, up to 3 minutes)."""
    now = dt.datetime.now(dt.UTC)
    return now.replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=1)


def prepare_pipeline(work: Path, start: dt.datetime) -> None:
    """The demo config trimmed to its orders stream, starting at ``start``; its DAG in
    ``work/dags``; one interval of demo data delivered to the landing folder."""
    raw = yaml.safe_load(DEMO_CONFIG.read_text())
    # One stage is enough to prove the orchestration; each further stage is one more
    # Spark task process a run waits for.
    del raw["streams"]["lineitem"], raw["masters"]["partsupp"], raw["masters"]["promotions"]
    raw["quality"] = {k: v for k, v in raw["quality"].items() if k == "orders_customer"}
    raw["stages"] = [s for s in raw["stages"] if s["output"] == "orders_customer"]
    # k = 2, one step a run, 2 intervals: a run answers half an R-cycle, the next the rest.
    raw["stages"][0]["operator"] = {"mode": "ssbj", "partitions": 2, "steps_per_run": 1}
    raw["stages"][0]["freshness"] = {"complete_within": "2 intervals"}
    raw["expectations_dir"] = str(REPO_ROOT / "expectations")
    at = start.replace(tzinfo=None).isoformat()
    # One interval: the DAG's first is its last, so catching up runs exactly that one.
    raw["schedule"] = {**raw.get("schedule", {}), "start": at, "end": at, "catchup": True}
    config = work / "demo.yaml"
    config.write_text(yaml.safe_dump(raw))
    for argv in (
        ["generate-dag", "--out", str(work / "dags" / f"{DAG_ID}.py")],
        ["demo-data", "--scale", "0.002", "--intervals", "1", "--start", start.isoformat()],
    ):
        done = subprocess.run(
            [*ENRICH, "--config", str(config), *argv],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    consumer = CONSUMER_DAG.format(seen=str(work / "consumed.jsonl"), dag_id=CONSUMER_ID)
    (work / "dags" / f"{CONSUMER_ID}.py").write_text(consumer)
    outbox = work / "var" / "demo" / "outbox"
    manifest = json.loads((outbox / "manifest.json").read_text())
    written = [dt.datetime.fromisoformat(i).replace(tzinfo=dt.UTC) for i in manifest["intervals"]]
    assert written == [start], manifest["intervals"]
    landing = parse_config(raw).streams["orders"].landing  # relative: the work folder's
    deliver(outbox, "orders", 0, work / landing)


@contextmanager
def airflow_services(postgres: PostgresServer, home: Path, work: Path) -> Iterator[Airflow]:
    database = postgres.create_database()
    url = postgres.url(database)
    port = free_port()
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(work / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_ASYNC": url.replace(
            "postgresql+psycopg://", "postgresql+psycopg_async://"
        ),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PYTHONPATH": str(REPO_ROOT),
    }
    env.pop("SPARK_REMOTE", None)
    logs = home / "service-logs"
    logs.mkdir(parents=True)
    airflow = Airflow(f"http://127.0.0.1:{port}", env, logs)
    airflow.cli("db", "migrate")
    airflow.cli("pools", "set", "enrich_spark", "1", "Spark drivers of the pipeline")
    processes = []
    try:
        for service in (["api-server", "--port", str(port)], ["scheduler"], ["dag-processor"]):
            log = (logs / f"{service[0]}.log").open("wb")
            processes.append(
                subprocess.Popen(
                    [AIRFLOW, *service],
                    env=env,
                    cwd=work,  # the tasks' working directory: the config's relative paths
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{airflow.url}/auth/token", timeout=5) as answer:
                    airflow.token = json.loads(answer.read())["access_token"]
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                assert all(p.poll() is None for p in processes), airflow.service_logs()
                assert time.monotonic() < deadline, f"no api-server\n{airflow.service_logs()}"
                time.sleep(2)
        yield airflow
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        postgres.drop_database(database)


def wait_for_dag(airflow: Airflow, dag_id: str = DAG_ID) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            airflow.request("GET", f"/api/v2/dags/{dag_id}")
            return
        except urllib.error.HTTPError as e:
            assert e.code == 404, e
        assert time.monotonic() < deadline, f"{dag_id} never parsed\n{airflow.service_logs()}"
        time.sleep(2)


def screenshot_run(airflow: Airflow, run_id: str, name: str) -> Path:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "Debian chromium is missing: `make test` installs it"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    target = SCREENSHOTS / name
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(f"{airflow.url}/auth/token/login")  # all admins: sets the session cookie
        page.goto(f"{airflow.url}/dags/{DAG_ID}/runs/{run_id}")
        page.get_by_text("stage_orders_customer").first.wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        page.screenshot(path=str(target), full_page=True)
        text = page.inner_text("body")
        browser.close()
    assert run_id in text or "success" in text.lower(), text[:2000]
    return target


def test_airflow_services_run_the_pipeline_then_a_backfill(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    start = interval_start()
    work = tmp_path / "work"
    work.mkdir()
    prepare_pipeline(work, start)
    with airflow_services(postgres_server, tmp_path / "airflow", work) as airflow:
        wait_for_dag(airflow, CONSUMER_ID)
        airflow.request("PATCH", f"/api/v2/dags/{CONSUMER_ID}", {"is_paused": False})
        wait_for_dag(airflow)
        airflow.request("PATCH", f"/api/v2/dags/{DAG_ID}", {"is_paused": False})

        run = airflow.wait_for_run(lambda r: r["run_type"] == "scheduled", "scheduled run")
        states = airflow.task_states(run["dag_run_id"])
        assert run["state"] == "success", airflow.failures(run["dag_run_id"])
        assert dt.datetime.fromisoformat(run["data_interval_start"]) == start
        live = ["route", "ingest", "stage_orders_customer"]
        assert states == {
            **dict.fromkeys([*live, "validate"], "success"),
            # Half the interval's tuples wait in SSBJ's state: no interval became complete.
            "complete_orders_customer": "skipped",
            "backfill": "skipped",
        }
        (published,) = airflow.asset_events(GOLD)
        assert published["source_run_id"] == run["dag_run_id"]
        extra = published["extra"]
        assert (extra["interval_start"], extra["complete"]) == (start.isoformat(), False), extra
        assert 0.0 <= extra["share_answered"] < 1.0 and extra["waiting"] > 0, extra
        assert airflow.asset_events(COMPLETE) == [] and airflow.dag_runs(CONSUMER_ID) == []
        # The pipeline's own INFO lines reach the task logs Airflow serves.
        stage_log = airflow.task_log(run["dag_run_id"], "stage_orders_customer")
        assert re.search(r"orders_customer: \d+ step\(s\), [\d,]+ tuple\(s\) in", stage_log), (
            stage_log[-3000:]
        )
        validate_log = airflow.task_log(run["dag_run_id"], "validate")
        assert "published" in validate_log
        # Each task sent its command to the pipeline's warm worker (the DAG's default):
        # validate found the Spark session the earlier tasks' commands had started: its
        # session_start is the active session's look-up (0.0-0.1 s on a loaded machine),
        # not a session's start (3 s or more).
        assert "enrich --worker stage orders_customer" in stage_log, stage_log[-3000:]
        assert re.search(
            r"task validate of run \S+ took [\d.]+s: .*session_start 0\.[0-4]s", validate_log
        ), validate_log[-3000:]
        shot = screenshot_run(airflow, run["dag_run_id"], "airflow-dag-run.png")
        assert shot.stat().st_size > 10_000

        # A second run (manual, without a data interval: complete is judged against now)
        # answers the rest: the interval became complete, and only now the consumer runs.
        second = airflow.request("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None})
        done = airflow.wait_for_run(lambda r: r["dag_run_id"] == second["dag_run_id"], "second run")
        assert done["state"] == "success", airflow.failures(done["dag_run_id"])
        assert airflow.task_states(done["dag_run_id"])["complete_orders_customer"] == "success"
        consumed = airflow.wait_for_run(lambda r: True, "consumer run", dag_id=CONSUMER_ID)
        assert consumed["state"] == "success"
        (completed,) = airflow.asset_events(COMPLETE)
        assert completed["source_run_id"] != run["dag_run_id"]
        intervals = completed["extra"]["intervals"]
        assert intervals[0]["interval_start"] == start.isoformat(), completed
        assert [(r["dag_id"], r["run_id"]) for r in completed["created_dagruns"]] == [
            (CONSUMER_ID, consumed["dag_run_id"])
        ]
        seen = [json.loads(line) for line in (work / "consumed.jsonl").read_text().splitlines()]
        assert [(s["run_id"], s["uri"]) for s in seen] == [(consumed["dag_run_id"], COMPLETE)]
        assert seen[0]["extra"]["intervals"][0]["interval_start"] == start.isoformat()

        airflow.cli(
            *("backfill", "create", "--dag-id", DAG_ID),
            *("--from-date", start.isoformat(), "--to-date", start.isoformat()),
            *("--reprocess-behavior", "completed"),
        )
        backfill = airflow.wait_for_run(lambda r: r["run_type"] == "backfill", "backfill run")
        states = airflow.task_states(backfill["dag_run_id"])
        assert backfill["state"] == "success", airflow.failures(backfill["dag_run_id"])
        assert states["route"] == "success" and states["backfill"] == "success", states
        assert {states[t] for t in [*live[1:], "validate", "complete_orders_customer"]} == {
            "skipped"
        }, states
        backfill_log = airflow.task_log(backfill["dag_run_id"], "backfill")
        assert "backfill" in backfill_log and "published" in backfill_log, backfill_log[-3000:]

        shot = screenshot_run(airflow, backfill["dag_run_id"], "airflow-backfill-run.png")
        assert shot.stat().st_size > 10_000
