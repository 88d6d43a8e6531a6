"""The pipeline configuration: one YAML file, validated with pydantic.

A config declares the warehouse (root, state store, engine), the streams and their landing
zones, the master tables, the enrichment stages and the quality suites per output table.
Unknown keys are errors, and every error message names the offending key path, such as
``stages.1.input: unknown table 'ordrs'; known: orders, customer_orders``.

Any string value may reference environment variables as ``${NAME}`` (``$${`` is a literal
``${``), so that secrets such as the state store's password stay out of the file::

    warehouse:
      state_store: postgresql+psycopg://enrich:${ENRICH_DB_PASSWORD}@db.internal/enrich

References are resolved when the config is loaded; an unset variable is a
:class:`ConfigError` naming the key and the variable, unless the reference gives a default
as a shell does, ``${NAME:-default}`` (used when NAME is unset or empty): one config then
runs on local disk and, with a variable set, on an object store. Resolved values live only in the
loaded model: they are never written back or logged, and the values of secret-looking
variables and keys, and URL passwords, are registered with :mod:`common.secrets` so that
log lines mask them.

This module imports neither Spark nor GX, so the Airflow DAG and the CLI can validate a
config cheaply.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from common.durations import parse_duration
from common.errors import ConfigError
from common.model import Identifier, Strict
from common.secrets import looks_secret, mask_url, register_secret, register_url_password
from pipeline.freshness import (
    check_late_wait,
    check_steps,
)
from pipeline.stage_config import EquiStage, Stage, ThetaStage
from quality.config import QualityConfig
from warehouse.delta.api import CHECKPOINT_INTERVAL_PROPERTY
from warehouse.landing_zone import GLOB_CHARACTERS, glob_characters_in
from warehouse.object_store import is_object_store

SIMPLE_TYPES = (
    "string",
    "bigint",
    "int",
    "smallint",
    "double",
    "float",
    "boolean",
    "date",
    "timestamp",
)
DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
# A column in one string: its name, its type (a decimal's "p, s" may hold a space) and an
# optional "not null", case as written.
COLUMN_TEXT = re.compile(r"^(\S+)\s+(decimal\s*\([^)]*\)|\S+)(\s+not\s+null)?$", re.IGNORECASE)
# "$${" (a literal "${"), "${NAME}", "${NAME:-default}", or a "${" that starts no valid
# reference.
ENV_REFERENCE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")
# The state store URL of every command when set: it beats `warehouse.state_store`.
STATE_STORE_ENV = "ENRICH_STATE_STORE"


def _duration_text(value: str) -> str:
    parse_duration(value)  # its ValueError says what a duration looks like
    return value


DurationText = Annotated[str, AfterValidator(_duration_text)]
"""A duration as written (``90s``, ``15m``, ``2h``), checked when the config loads."""


class ColumnSpec(Strict):
    """A stream column: ``{name, type, nullable}``, or the same in one string as SQL writes
    it, ``"id bigint not null"``."""

    name: Identifier
    type: str
    nullable: bool = True

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        found = COLUMN_TEXT.match(value.strip())
        if found is None:
            raise ValueError(
                f"column {value!r}: expected 'NAME TYPE' or 'NAME TYPE not null' "
                "(or a mapping {name, type, nullable})"
            )
        name, column_type, not_null = found.groups()
        return {"name": name, "type": column_type, "nullable": not_null is None}

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        value = value.strip().lower()
        if value in SIMPLE_TYPES or DECIMAL.match(value):
            return value
        raise ValueError(
            f"unknown column type {value!r}; expected one of {SIMPLE_TYPES} or decimal(p,s)"
        )


class WarehouseConfig(Strict):
    # Local, or an object store (s3://bucket/prefix; endpoint and credentials from the
    # environment, see warehouse.object_store).
    root: str = "var/warehouse"
    # Where the driver keeps what is not a table (the SQLite state store, the Great
    # Expectations project and its Data Docs, run reports): the root itself when that is
    # local; under an object-store root, var/<pipeline name> unless set.
    local_root: str | None = None
    state_store: str | None = None
    engine: Literal["auto", "embedded", "native"] = "auto"
    vacuum_retention_hours: float = Field(default=168.0, ge=0)
    # A writer renews its lease every third of this; a killed writer's lease on the same host
    # is taken over at once, one on another host after this long.
    lease_ttl_seconds: float = Field(default=60.0, gt=0)
    # Every table the pipeline creates writes a checkpoint every this many commits, so a
    # reader replays at most this many JSON commits (Delta's own default is 100, more than
    # a small table ever reaches: its log grows one JSON file per micro-batch forever).
    checkpoint_interval: int = Field(default=10, ge=1)
    # `enrich maintain` rewrites the published tables' small files into files of about this
    # size (each scheduled run publishes a few small files per interval partition).
    compact_target_bytes: int = Field(default=128 * 2**20, ge=2**20)

    def table_properties(self) -> dict[str, str]:
        """The properties every table the pipeline creates starts with."""
        return {CHECKPOINT_INTERVAL_PROPERTY: str(self.checkpoint_interval)}

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            shown = mask_url(value) if name == "state_store" and isinstance(value, str) else value
            yield name, shown  # the state store URL may carry a password

    def driver_root(self) -> str:
        """The local folder of the driver's own files (:attr:`local_root`)."""
        if self.local_root is not None:
            return self.local_root
        if is_object_store(self.root):
            raise ConfigError(
                "warehouse.local_root: an object-store root needs a local folder for the "
                "driver's files; load the config with load_config, which defaults it"
            )
        return self.root

    def resolved_state_store(self) -> str:
        """``ENRICH_STATE_STORE``, else ``state_store``, else SQLite under the warehouse: the
        environment wins, so one config runs locally and against a deployment's database
        (an Airflow task sets it from the ``enrich_state_store`` connection)."""
        return (
            os.environ.get(STATE_STORE_ENV)
            or self.state_store
            or f"sqlite:///{Path(self.driver_root()).resolve() / '_state' / 'pipeline.db'}"
        )


class SparkConfig(Strict):
    master: str | None = Field(
        default=None,
        description="the Spark master; `enrich --master` and SPARK_MASTER override it, and "
        "without any of them Spark runs in-process on local[2]",
    )
    conf: dict[str, str] = Field(default_factory=dict)
    remote: str | None = Field(
        default=None,
        description=(
            "a Spark Connect server, sc://host:port: every command connects to it instead of "
            "starting Spark in-process (start one with `enrich spark-server`); "
            "SPARK_REMOTE sets it when the key is absent"
        ),
    )

    @field_validator("remote")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is not None:
            from warehouse.connect_address import parse_remote

            parse_remote(value)  # a ValueError names what is wrong with the URL
        return value


class WorkerConfig(Strict):
    """The warm pipeline worker the DAG's tasks run their commands in (``jobs/worker.py``)."""

    enabled: bool = Field(
        default=True,
        description="each DAG task sends its `enrich` command to a long-lived worker process "
        "(started by the first task that finds none) instead of starting Python, Spark and "
        "Great Expectations itself; false runs every task's command in the task's process",
    )
    idle_timeout: DurationText = Field(
        default="2h",
        description="a worker with no command for this long exits (the next task starts one)",
    )
    max_commands: int = Field(
        default=500,
        ge=1,
        description="a worker exits after this many commands, so a long-lived process "
        "is recycled (memory, the JVM's heap)",
    )

    @property
    def idle_timeout_seconds(self) -> float:
        return parse_duration(self.idle_timeout).total_seconds()


class ScheduleConfig(Strict):
    interval: DurationText = "1h"
    start: datetime = datetime(2024, 1, 1)
    end: datetime | None = Field(
        default=None,
        description="the DAG's end date (Airflow's end_date): no interval starting after it "
        "is scheduled; unset, the schedule runs on",
    )
    catchup: bool = False
    retries: int = Field(default=2, ge=0, description="Airflow task retries")
    task_timeout: DurationText = Field(
        default="2h",
        description="Airflow's execution_timeout of each task: a hung Spark job fails the "
        "task (and is retried) instead of holding the run forever",
    )
    pool: str = Field(
        default="enrich_spark",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="the Airflow pool every Spark task of the DAG takes a slot of: its size "
        "bounds how many Spark drivers run at once",
    )
    worker: WorkerConfig = Field(default_factory=WorkerConfig)

    @model_validator(mode="after")
    def _ends_after_it_starts(self) -> ScheduleConfig:
        if self.end is not None and self.end < self.start:
            raise ValueError(
                f"end: {self.end.isoformat()} is before start {self.start.isoformat()}; "
                "expected the start of the last interval to run, or later"
            )
        return self

    @property
    def task_timeout_delta(self) -> timedelta:
        return parse_duration(self.task_timeout)

    @property
    def interval_delta(self) -> timedelta:
        return parse_duration(self.interval)


class StreamConfig(Strict):
    landing: str
    format: Literal["json", "csv", "parquet"]
    columns: list[ColumnSpec] = Field(min_length=1)
    event_time: Identifier
    id_column: Identifier
    csv_header: bool = True
    csv_delimiter: str = ","

    @model_validator(mode="after")
    def _columns_exist(self) -> StreamConfig:
        names = [c.name for c in self.columns]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"columns: duplicate names {duplicates}")
        for key in ("event_time", "id_column"):
            value = getattr(self, key)
            if value not in names:
                raise ValueError(f"{key}: column {value!r} is not declared; declared: {names}")
        event_type = next(c.type for c in self.columns if c.name == self.event_time)
        if event_type != "timestamp":
            raise ValueError(
                f"event_time: column {self.event_time!r} must be a timestamp, is {event_type}"
            )
        return self


class MasterConfig(Strict):
    table: str
    keys: list[Identifier] = Field(min_length=1)
    columns: list[Identifier] = Field(min_length=1)


class PipelineConfig(Strict):
    name: Identifier
    warehouse: WarehouseConfig = Field(default_factory=WarehouseConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    streams: dict[Identifier, StreamConfig] = Field(min_length=1)
    masters: dict[Identifier, MasterConfig] = Field(default_factory=dict)
    stages: list[Stage] = Field(default_factory=list)
    quality: dict[Identifier, QualityConfig] = Field(default_factory=dict)
    expectations_dir: str = Field(
        default="../expectations",
        description="where the Great Expectations suite files live; a relative path is "
        "anchored at the config file's folder, since suites are versioned with the config",
    )
    data_docs: Literal["report", "validate"] = Field(
        default="report",
        description="when passing validations' Data Docs pages are rendered: by the run "
        "report (`enrich report`, the quality-report DAG; default), or by each `validate` "
        "(about 0.9 s each). Failed validations are rendered by `validate` either way",
    )
    docs_assets_dir: str | None = Field(
        default=None,
        description="the npm packages Data Docs pages load (jQuery, Bootstrap, ...), copied "
        "into the site so it renders offline; default: var/docs-assets of the source "
        "checkout, where `make setup` fetches them",
    )

    @model_validator(mode="after")
    def _references(self) -> PipelineConfig:
        known = list(self.streams)
        for index, stage in enumerate(self.stages):
            where = f"stages.{index}"
            if stage.input not in known:
                raise ValueError(
                    f"{where}.input: unknown table {stage.input!r}; known so far: {known}"
                )
            if stage.master not in self.masters:
                raise ValueError(
                    f"{where}.master: unknown master {stage.master!r}; known: {list(self.masters)}"
                )
            if stage.output in known or stage.output in self.masters:
                raise ValueError(f"{where}.output: name {stage.output!r} is already in use")
            master = self.masters[stage.master]
            if isinstance(stage, EquiStage):
                bad = [m for m in stage.join_on.values() if m not in master.columns]
                if bad:
                    raise ValueError(
                        f"{where}.join_on: master columns {bad} are not projected by master "
                        f"{stage.master!r} (columns: {master.columns})"
                    )
            _check_freshness(stage, self.schedule.interval_delta, where)
            known.append(stage.output)
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stages: duplicate stage names in {names}")
        outputs = {s.output for s in self.stages}
        for table in self.quality:
            if table not in outputs:
                raise ValueError(
                    f"quality.{table}: not an output table; outputs: {sorted(outputs)}"
                )
        return self

    @model_validator(mode="after")
    def _landing_zones(self) -> PipelineConfig:
        """Landing zones are listed recursively: none may hold another, or the warehouse."""
        zones = {name: _folder(stream.landing) for name, stream in self.streams.items()}
        for name, zone in zones.items():
            where = f"streams.{name}.landing"
            landing = self.streams[name].landing
            if is_object_store(landing) and (
                glob_characters_in(landing) or not urlsplit(landing).netloc
            ):
                raise ValueError(
                    f"{where}: expected s3://bucket/prefix without any of "
                    f"{GLOB_CHARACTERS!r} (Spark expands them), found {landing!r}"
                )
            root = _folder(self.warehouse.root)
            if zone.startswith(root) or root.startswith(zone):
                raise ValueError(
                    f"{where}: {self.streams[name].landing!r} and the warehouse root "
                    f"{self.warehouse.root!r} must not hold one another (a landing zone is "
                    "listed with everything below it)"
                )
            for other, other_zone in zones.items():
                if other != name and other_zone.startswith(zone):
                    raise ValueError(
                        f"{where}: {self.streams[name].landing!r} holds the landing zone of "
                        f"stream {other!r} ({self.streams[other].landing!r}); give each stream "
                        "a folder of its own"
                    )
        return self

    def stage(self, name: str) -> EquiStage | ThetaStage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ConfigError(f"no stage named {name!r}; stages: {[s.name for s in self.stages]}")

    def locations(self) -> list[str]:
        """Every place the pipeline reads or writes data: the warehouse root, the landing
        zones and the masters given as locations of their own."""
        masters = [m.table for m in self.masters.values() if "://" in m.table]
        return [self.warehouse.root, *(s.landing for s in self.streams.values()), *masters]

    def uses_object_store(self) -> bool:
        return any(is_object_store(location) for location in self.locations())

    def resolve_paths(self, base: Path) -> PipelineConfig:
        """Return a copy whose relative paths are anchored at ``base`` (the working directory)."""

        def anchor(path: str) -> str:
            return (
                path if "://" in path or Path(path).is_absolute() else str((base / path).resolve())
            )

        local_root = self.warehouse.local_root
        if local_root is None and is_object_store(self.warehouse.root):
            local_root = f"var/{self.name}"
        warehouse = self.warehouse.model_copy(
            update={
                "root": anchor(self.warehouse.root),
                "local_root": anchor(local_root) if local_root is not None else None,
            }
        )
        streams = {
            name: s.model_copy(update={"landing": anchor(s.landing)})
            for name, s in self.streams.items()
        }
        return self.model_copy(
            update={
                "warehouse": warehouse,
                "streams": streams,
                "expectations_dir": anchor(self.expectations_dir),
                "docs_assets_dir": (
                    anchor(self.docs_assets_dir) if self.docs_assets_dir is not None else None
                ),
            }
        )  # expectations_dir is already absolute when the config came from a file

    def producing_stage(self, table: str) -> EquiStage | ThetaStage:
        for stage in self.stages:
            if stage.output == table:
                return stage
        raise ConfigError(f"{table!r} is not an output table; outputs: {self.outputs()}")

    def outputs(self) -> list[str]:
        return [stage.output for stage in self.stages]

    def root_stream(self, table: str) -> str:
        """The stream whose tuples flow into ``table`` (through any chain of stages)."""
        while table not in self.streams:
            table = self.producing_stage(table).input
        return table


def _folder(location: str) -> str:
    """``location`` normalised with one trailing slash, for comparing folders by prefix."""
    if "://" in location:
        return location.rstrip("/") + "/"
    return posixpath.normpath(location) + "/"


def _check_freshness(stage: EquiStage | ThetaStage, interval: timedelta, where: str) -> None:
    """Refuse a stage config that cannot keep its freshness bound, naming the key."""
    try:
        bound = stage.freshness.bound(interval)
    except ValueError as e:
        raise ValueError(f"{where}.freshness.complete_within: {e}") from e
    if not isinstance(stage, EquiStage):
        return  # a theta stage answers every tuple in the run that takes it
    operator = stage.operator
    if operator.late_master is not None:
        try:
            check_late_wait(operator.late_master.wait_delta, bound)
        except ValueError as e:
            raise ValueError(f"{where}.operator.late_master.wait: {e}") from e
    if operator.mode != "baseline" and operator.steps_per_run is not None:
        try:
            check_steps(operator.partitions, operator.steps_per_run, bound)
        except ValueError as e:
            raise ValueError(f"{where}.operator.steps_per_run: {e}") from e


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Read and validate a config file; raise :class:`ConfigError` naming the bad key."""
    source = Path(path)
    try:
        raw = yaml.safe_load(source.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read config {source}: {e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"config {source} is not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config {source} must be a mapping at the top level, got {type(raw).__name__}"
        )
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    config = parse_config(raw, str(source))
    suites = Path(config.expectations_dir)
    if not suites.is_absolute() and "://" not in config.expectations_dir:
        suites = (source.resolve().parent / suites).resolve()
        config = config.model_copy(update={"expectations_dir": str(suites)})
    return config.resolve_paths(Path.cwd())


def parse_config(raw: dict[str, Any], source: str = "<config>") -> PipelineConfig:
    """Resolve ``${NAME}`` references, then validate; raise :class:`ConfigError` naming the key."""
    raw = resolve_env_references(raw, source)
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as e:
        problems = []
        for error in e.errors():
            location = ".".join(str(p) for p in error["loc"] if not str(p).startswith("function-"))
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"  {location or '<top>'}: {message}")
        raise ConfigError(f"invalid config {source}:\n" + "\n".join(problems)) from e


def resolve_env_references(
    raw: dict[str, Any], source: str = "<config>", environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A copy of ``raw`` whose string values have every ``${NAME}`` replaced by ``$NAME``.

    ``raw`` itself is left as it is, so nothing that writes a config back out can write a
    resolved secret.
    """
    env = os.environ if environ is None else environ
    return {k: _resolve_node(v, (str(k),), source, env) for k, v in raw.items()}


def _resolve_node(node: Any, key: tuple[str, ...], source: str, env: Mapping[str, str]) -> Any:
    if isinstance(node, dict):
        return {k: _resolve_node(v, (*key, str(k)), source, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_node(v, (*key, str(i)), source, env) for i, v in enumerate(node)]
    if isinstance(node, str) and "${" in node:
        return _substitute(node, key, source, env)
    return node


def _substitute(value: str, path: tuple[str, ...], source: str, env: Mapping[str, str]) -> str:
    key, secret_key = ".".join(path), looks_secret(path[-1])

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        name = match.group(1)
        if name is None:
            raise ConfigError(
                f"invalid config {source}:\n  {key}: expected ${{NAME}} at character "
                f"{match.start() + 1}, with NAME made of letters, digits and _ (not starting "
                "with a digit), found a '${' that is unclosed or names no variable; write "
                "$${ for a literal ${"
            )
        default = match.group(2)
        if default is not None and not env.get(name):
            return default
        if name not in env:
            raise ConfigError(
                f"invalid config {source}:\n  {key}: environment variable {name} is not set "
                f"(referenced as ${{{name}}}); expected it in the environment of the process "
                "that loads the config"
            )
        if secret_key or looks_secret(name):
            register_secret(env[name])
        return env[name]

    resolved = ENV_REFERENCE.sub(replace, value)
    if "://" in resolved:
        register_url_password(resolved)
    return resolved


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    node = raw
    *parents, leaf = dotted.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
