"""docker-compose.yml: valid against the Compose Specification, every command real, no
secret with a default.

Docker does not run here, so the file is checked the ways that do not need it: its
structure against the schema `docker compose` itself validates with (compose-go's
``compose-spec.json``, fetched by ``make compose-schema``); every command and healthcheck of
a service built from docker/Dockerfile names a program that image installs (this
checkout's own environment is built from the same lock file, so its ``bin`` folders are the
reference) or a project file, and each Airflow, Spark or ``enrich`` subcommand exists; and
every ``${VAR}`` is required (``${VAR:?message}``), listed empty in ``.env.example`` and kept
out of git.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.conftest import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
SCHEMA = REPO_ROOT / "var" / "schemas" / "compose-spec.json"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
VENV_BIN = Path(sys.executable).parent
PYSPARK_HOME = Path(__import__("pyspark").__file__).resolve().parent
IMAGE_ROOT = "/opt/enrich/"  # where docker/Dockerfile copies the project
# The official postgres image's own programs (the one service not built from the project).
POSTGRES_IMAGE_PROGRAMS = frozenset({"pg_isready", "psql", "postgres"})
# The SeaweedFS image's: its server (the entrypoint) and busybox's wget for the healthcheck.
SEAWEEDFS_IMAGE_PROGRAMS = frozenset({"weed", "wget"})
REFERENCE = re.compile(r"\$\{([^}]*)\}")


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())  # resolves the anchors and `<<` merges
    assert isinstance(loaded, dict)
    return loaded


def test_the_file_validates_against_the_compose_specification() -> None:
    assert SCHEMA.is_file(), f"{SCHEMA} is missing: run `make compose-schema` (part of setup)"
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)
    # The validator sees a broken file as broken (the schema is not vacuous).
    broken = compose()
    broken["services"]["spark-master"]["healthcheck"]["retries"] = "many"
    broken["services"]["postgres"]["depends_on"] = {"nothing": {"condition": "whenever"}}
    assert len(list(validator.iter_errors(broken))) >= 2


def test_the_team_topology_is_all_there_with_healthchecks() -> None:
    services = compose()["services"]
    assert {
        "postgres",
        "airflow-init",
        "airflow-api-server",
        "airflow-scheduler",
        "airflow-dag-processor",
        "spark-master",
        "spark-worker-1",
        "spark-worker-2",
        "object-store",
    } <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        if name != "airflow-init":  # a one-shot job, waited for by completion
            assert "healthcheck" in service, f"{name} has no healthcheck"
    # No disk is shared: the warehouse is in the object store, the workers mount nothing.
    for name in ("spark-worker-1", "spark-worker-2"):
        assert not services[name].get("volumes"), f"{name} must not share a disk"
    mounted = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
    assert "warehouse" not in mounted and "warehouse" not in compose()["volumes"]
    env = services["airflow-scheduler"]["environment"]
    assert env["ENRICH_DEMO_WAREHOUSE"].startswith("s3://")
    assert env["ENRICH_DEMO_LANDING"].startswith("s3://")
    store = json.loads(env["AIRFLOW_CONN_ENRICH_OBJECT_STORE"])
    assert store["conn_type"] == "aws"
    assert store["extra"]["endpoint_url"] == "http://object-store:8333"
    assert "object-store" in services["airflow-scheduler"]["depends_on"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW_CONN_ENRICH_SPARK"] == "spark://spark-master:7077"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg://")


def commands() -> list[tuple[str, list[str]]]:
    """(service, argv) of every command and CMD healthcheck of the services."""
    found = []
    for name, service in compose()["services"].items():
        if "command" in service:
            found.append((name, list(service["command"])))
        test = service.get("healthcheck", {}).get("test")
        if test:
            assert test[0] in ("CMD", "CMD-SHELL"), f"{name}: healthcheck {test}"
            found.append((name, list(test[1:]) if test[0] == "CMD" else ["sh", "-c", *test[1:]]))
    return found


def test_every_command_is_a_program_the_image_installs_or_a_project_file() -> None:
    checked = 0
    for name, argv in commands():
        program = argv[0]
        service = compose()["services"][name]
        if service.get("image", "").startswith("postgres:"):
            assert program in POSTGRES_IMAGE_PROGRAMS, f"{name}: {program}"
            continue
        if service.get("image", "").startswith("chrislusf/seaweedfs:"):
            # The command is the entrypoint's (weed's) subcommand; a healthcheck a program.
            entry = service.get("entrypoint", [])
            assert program in SEAWEEDFS_IMAGE_PROGRAMS or (
                entry == ["weed"] and program == "mini"
            ), f"{name}: {argv}"
            continue
        if program.startswith(IMAGE_ROOT):
            script = REPO_ROOT / program.removeprefix(IMAGE_ROOT)
            assert script.is_file() and script.stat().st_mode & 0o111, f"{name}: {script}"
        else:
            installed = [VENV_BIN / program, PYSPARK_HOME / "bin" / program]
            assert any(p.is_file() for p in installed), f"{name}: {program} not in {installed}"
        checked += 1
    assert checked >= 8


def _in_spark_jars(class_name: str) -> bool:
    entry = class_name.replace(".", "/") + ".class"
    for jar in (PYSPARK_HOME / "jars").glob("spark-core_*.jar"):
        with zipfile.ZipFile(jar) as archive:
            if entry in archive.namelist():
                return True
    return False


def test_every_subcommand_exists(airflow_home: Path) -> None:
    """Each `airflow ...`, `enrich ...` and `spark-class <class>` of the file and of the
    init script answers `--help` (or is a class in Spark's jars). Airflow's commands are
    parsed by Airflow's own CLI parser in this process (the test's Airflow home), not one
    `airflow` process each (about 4 s apiece)."""
    asked: set[tuple[str, ...]] = set()
    script = (REPO_ROOT / "docker" / "airflow-init.sh").read_text()
    lines = [line.split() for line in script.splitlines() if line.strip()]
    argvs = [argv for _, argv in commands()] + [
        words for words in lines if words[0] in ("airflow", "enrich")
    ]
    for argv in argvs:
        if argv[0] == "spark-class":
            assert _in_spark_jars(argv[1]), argv
        elif argv[0] == "airflow":
            words = [w for w in argv[1:3] if not w.startswith("-") and not w.startswith('"')]
            asked.add(("airflow", *words[: 2 if words[0] in ("jobs", "db", "pools") else 1]))
        elif argv[0] == "enrich":
            asked.add(("enrich", next(w for w in argv[1:] if w == "generate-dag")))
    assert ("airflow", "api-server") in asked and ("airflow", "pools", "set") in asked
    from airflow.cli.cli_parser import get_parser

    airflow = get_parser()
    for words in sorted(asked):
        if words[0] == "airflow":
            printed = io.StringIO()
            with (
                pytest.raises(SystemExit) as done,
                contextlib.redirect_stdout(printed),
                contextlib.redirect_stderr(printed),
            ):
                airflow.parse_args([*words[1:], "--help"])
            assert done.value.code == 0, f"{' '.join(words)} --help: {printed.getvalue()[-1500:]}"
            continue
        ran = subprocess.run(
            [str(VENV_BIN / words[0]), *words[1:], "--help"],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO_ROOT,
        )
        assert ran.returncode == 0, f"{' '.join(words)} --help: {ran.stderr[-1500:]}"


def test_no_secret_has_a_default_and_every_variable_is_documented() -> None:
    text = COMPOSE.read_text() + (REPO_ROOT / "docker" / "postgres-init.sh").read_text()
    names = set()
    for body in REFERENCE.findall(COMPOSE.read_text()):
        name, _, rest = body.partition(":")
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), f"${{{body}}}: no default allowed"
        assert rest.startswith("?") and rest[1:].strip(), f"${{{body}}} must be ${{{name}:?why}}"
        names.add(name)
    literal = REFERENCE.sub("", text)  # what is left once every reference is gone
    assert not re.search(r"(?i)(password|secret|fernet_key)\w*[ \t]*[:=][ \t]*['\"]?\w", literal), (
        "a literal secret in the deployment files"
    )
    assert not re.search(r"://[^:/\s]+:[^@\s]+@", literal), "a literal password in a URL"
    example = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            example[key] = value
    assert set(example) == names, set(example) ^ names
    assert all(value == "" for value in example.values()), "no value may be committed"
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", ".env"], cwd=REPO_ROOT, check=False
    ).returncode
    assert ignored == 0, ".env must be ignored by git"


@pytest.mark.parametrize("mount", ["./docker/postgres-init.sh"])
def test_mounted_project_files_exist(mount: str) -> None:
    services = compose()["services"]
    mounts = [v.split(":")[0] for s in services.values() for v in s.get("volumes", [])]
    assert mount in mounts
    assert (REPO_ROOT / mount).is_file()
