"""The Spark Connect server the pipeline's commands can share, against a real server.

One server per module, started on a free loopback port by :class:`ConnectServer` with the
tests' settings. The clients run in child processes: pyspark allows one kind of session
per process, and this one holds the tests' in-process session.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from common.errors import ConfigError, SparkServerError
from pipeline.config import load_config
from tests.conftest import REPO_ROOT
from tests.helpers import TEST_SPARK_CONF, tiny_pipeline
from warehouse.connect_address import RemoteAddress, parse_remote, port_answers
from warehouse.connect_server import (
    ConnectServer,
    ConnectServerSettings,
    free_port,
    server_command,
)
from warehouse.spark import REQUIRED_CONF

SERVER_CONF = {**TEST_SPARK_CONF, "spark.driver.memory": "1g"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    log = tmp_path_factory.mktemp("connect") / "server.log"
    settings = ConnectServerSettings(
        address=RemoteAddress("127.0.0.1", free_port()), conf=SERVER_CONF, log_file=log
    )
    with ConnectServer(settings) as running:
        yield running


def run_client(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def enrich(config: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobs.enrich", "--config", str(config), *argv],
        cwd=REPO_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_remote_urls_are_parsed_and_bad_ones_named(tmp_path: Path) -> None:
    assert parse_remote("sc://db-host:15010") == RemoteAddress("db-host", 15010)
    assert parse_remote("sc://localhost").port == 15002
    assert parse_remote("sc://h:15003/;token=abc").url == "sc://h:15003"
    for bad in ("http://h:15002", "sc://:15002", "sc://h:notaport", "localhost:15002"):
        with pytest.raises(ValueError):
            parse_remote(bad)
    raw = {**tiny_pipeline(tmp_path, "k", "bigint"), "spark": {"remote": "spark://h:7077"}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"spark\.remote.*sc://host:port"):
        load_config(path)


def test_server_command_carries_every_required_setting() -> None:
    settings = ConnectServerSettings(address=RemoteAddress("127.0.0.1", 15123), conf={"a.b": "c"})
    command = server_command(settings)
    confs = {
        command[i + 1].split("=", 1)[0]: command[i + 1].split("=", 1)[1]
        for i, part in enumerate(command)
        if part == "--conf"
    }
    for key, value in REQUIRED_CONF.items():
        assert confs[key] == value, key
    assert confs["spark.connect.grpc.binding.port"] == "15123"
    assert confs["spark.connect.grpc.binding.address"] == "127.0.0.1"
    assert confs["a.b"] == "c"
    assert command[-1] == "spark-internal"


def test_a_server_that_exits_before_listening_is_reported_with_its_log(tmp_path: Path) -> None:
    settings = ConnectServerSettings(
        address=RemoteAddress("127.0.0.1", free_port()),
        master="no-such-master://x",
        conf=SERVER_CONF,
        log_file=tmp_path / "bad.log",
    )
    with pytest.raises(SparkServerError, match="exited with code") as info:
        ConnectServer(settings).start(timeout=120)
    assert "Master must either be" in str(info.value), "the error quotes the server's own log"
    assert not port_answers(settings.address)


def test_a_second_server_on_a_taken_port_is_refused(server: ConnectServer) -> None:
    taken = ConnectServerSettings(address=server.settings.address, conf=SERVER_CONF)
    with pytest.raises(SparkServerError, match="already listens"):
        ConnectServer(taken).start()
    assert port_answers(server.settings.address), "the refusal must leave the first one alone"


def test_a_client_session_gets_the_product_settings_and_writes_clean_delta(
    server: ConnectServer, tmp_path: Path
) -> None:
    # A Delta table written over Connect by the embedded engine: the server's static settings
    # (raw local file system, no _SUCCESS markers) leave nothing but Parquet and the log.
    result = run_client(
        f"""
        import json
        from pyspark.sql import functions as F
        from pyspark.sql import types as T
        from joins.theta.stats import key_samples
        from warehouse.delta import open_engine
        from warehouse.spark import SparkSettings, build_session, is_connect, plan_size

        spark = build_session(SparkSettings(remote={server.url!r}))
        engine = open_engine(spark, "auto")
        schema = T.StructType(
            [T.StructField("k", T.LongType()), T.StructField("v", T.StringType())]
        )
        engine.create_table({str(tmp_path / "t")!r}, schema)
        frame = spark.createDataFrame([(1, "a"), (2, "b"), (2, "b")], schema)
        engine.append({str(tmp_path / "t")!r}, frame)
        cached = frame.cache()  # the optimizer's estimate, read from the server's plan
        cached.count()
        print(json.dumps({{
            "connect": is_connect(spark),
            "engine": type(engine).__name__,
            "zone": spark.conf.get("spark.sql.session.timeZone"),
            "rows": sorted(tuple(r) for r in engine.read({str(tmp_path / "t")!r}).collect()),
            "estimate": [
                plan_size(cached).rows,
                plan_size(engine.read({str(tmp_path / "t")!r})).bytes > 0,
            ],
            # One job draws keys and observes the exact counts (DataFrame.observe).
            "sample": [
                [s.rows, s.keyed, len(s.keys)]
                for s in key_samples([(cached, F.col("k").cast("double"), None)], 2, 0, [3])
            ],
        }}))
        """,
        REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {
        "connect": True,
        "engine": "EmbeddedDeltaEngine",
        "zone": "UTC",
        "rows": [[1, "a"], [2, "b"], [2, "b"]],
        "estimate": [3, True],
        "sample": [[3, 3, 2]],
    }
    clutter = [
        p.name
        for p in (tmp_path / "t").rglob("*")
        if p.is_file() and (p.name.endswith(".crc") or p.name.startswith("_SUCCESS"))
    ]
    assert not clutter, f"Spark left side files in the table: {clutter}"


def test_commands_fail_fast_without_a_server_and_refuse_native_over_connect(
    server: ConnectServer, tmp_path: Path
) -> None:
    raw = tiny_pipeline(tmp_path, "k", "bigint")
    closed = free_port()
    raw["spark"] = {"remote": f"sc://127.0.0.1:{closed}"}
    nowhere = tmp_path / "nowhere.yaml"
    nowhere.write_text(yaml.safe_dump(raw))
    started = time.monotonic()
    result = enrich(nowhere, "run")
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"no Spark Connect server answers at sc://127.0.0.1:{closed}" in result.stderr
    assert time.monotonic() - started < 60, "an unreachable server must not be retried"

    raw["spark"] = {"remote": server.url}
    raw["warehouse"]["engine"] = "native"
    native = tmp_path / "native.yaml"
    native.write_text(yaml.safe_dump(raw))
    result = enrich(native, "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "warehouse.engine: native" in result.stderr
