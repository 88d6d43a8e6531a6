"""The continuous mode (``enrich stream``): the pipeline as the stream SSBJ was made for.

Structured Streaming drives it: one query on Spark's rate source is the clock. Its
micro-batch (``foreachBatch`` under a processing-time trigger) lists the streams' landing
zones and runs one pipeline micro-step, under the pipeline lease, as a ledger run of its
own, when files landed since its last listing or a stage holds pending tuples:

1. ingest what landed (the ledger loads each file once);
2. one step of every stage: an SSBJ stage takes one operator step without closing (its
   cycle advances a partition a step, so a tuple is answered within k steps, seconds
   apart, not k scheduled runs); a stateless stage joins what arrived;
3. validate: audit and publish what was staged, and record the intervals' completeness.

The clock lists the zones itself (one directory listing, or one LIST on an object store, a
trigger) rather than a Spark file query per stream saying that files landed: a file then
waits one trigger at most before its first step, not one tick of each query, and no query
writes offset, commit and source logs a trigger (BENCHMARKS.md section 1, session 49).
The trigger follows from the stages' freshness (``pipeline.freshness.stream_trigger``):
the longest that answers every tuple within its stage's stream bound, so the master is read
about once per bound, as a plain join run once per bound reads it, while hot keys are
answered a trigger after they land.
A clock tick does nothing unless files landed or a stage holds pending tuples (the first
one of a process always runs). The scheduled run
(``enrich run``, ``validate``) still closes each interval, as without the stream, and
takes the lease between micro-batches. Every step is the pipeline's idempotent one, so a
micro-batch Spark replays after a crash, or a killed stream process started again, ends
where an uninterrupted one would (Spark's checkpoint under ``_stream/`` keeps the
queries' progress; the ledger and the operators' plans keep the pipeline's).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from pyspark.sql import DataFrame
from pyspark.sql.streaming import StreamingQuery

from common.errors import ConfigError, EnrichmentError
from pipeline.config import PipelineConfig
from pipeline.context import PipelineContext
from pipeline.freshness import StreamNeed, stream_need, stream_trigger
from pipeline.stage_config import EquiStage
from warehouse.jvm_archive import DRIVER_OPTIONS
from warehouse.landing_location import zone_for
from warehouse.landing_zone import LandingZone
from warehouse.spark import with_idle_heartbeat

logger = logging.getLogger(__name__)

CLOCK = "_clock"
TICK_SECONDS = 1.0
"""How often the stream's main thread looks at its stop conditions."""
WATCH_SECONDS = 5.0
"""How often it asks Spark whether a query failed: each ask is a call into the JVM per
query, and asking five times a second cost the idle stream as much CPU as its JVM's own
housekeeping (BENCHMARKS.md section 1). Spark's own wait for a query's end
(``awaitAnyTermination``) wakes every 10 ms inside the JVM: dearer still."""


STREAM_MEMORY_BYTES = 1 << 30
"""SSBJ's memory budget M in the continuous mode when a stage sets none (1 GiB)."""


def with_stream_memory(config: PipelineConfig) -> PipelineConfig:
    """``config`` for the continuous mode: every equi stage without ``operator.memory_bytes``
    holds :data:`STREAM_MEMORY_BYTES`. A long-lived process must not let its state grow with
    the intake: under M (Eq. 1: disk buffer + H_R + s_B + H_S) a step admits only the
    input that fits and the rest waits in the input table, so a burst slows the intake
    (the completeness record shows the wait) rather than growing the driver's memory.
    A scheduled run keeps the config as written: its closing steps answer all it took."""
    stages = [
        stage.model_copy(
            update={
                "operator": stage.operator.model_copy(update={"memory_bytes": STREAM_MEMORY_BYTES})
            }
        )
        if isinstance(stage, EquiStage) and stage.operator.memory_bytes is None
        else stage
        for stage in config.stages
    ]
    return config.model_copy(update={"stages": stages})


STREAM_GC_OPTION = "-XX:+UseSerialGC"
"""The idle stream's driver JVM collects with one thread: G1's service and refinement
threads woke all the time on a heap that barely changes between micro-batches."""


def with_stream_session(config: PipelineConfig, remote: str | None) -> PipelineConfig:
    """``config`` with the continuous mode's session settings under its own
    (``spark.conf`` wins; driver JVM options that choose a collector keep it).

    A stream process is idle between micro-batches most of its life, and its JVM's
    housekeeping was most of its cost (measured on an idle ``enrich stream``, 120 s each:
    13.4 CPU s with Spark's defaults, 10.1 with the heartbeat every 60 s, 7.7 with the
    serial collector too; BENCHMARKS.md section 1). Over Spark Connect the JVM is the
    server's, and nothing is changed."""
    if remote is not None:
        return config
    # The heartbeat a local session has by default, on any master: a stream's executors
    # on a cluster report to a driver idle between micro-batches too, and their loss is
    # found by spark.network.timeout (120 s), not by the heartbeat's period.
    conf = with_idle_heartbeat(config.spark.conf)
    options = conf.get(DRIVER_OPTIONS, "")
    if not any(o.startswith("-XX:+Use") and o.endswith("GC") for o in options.split()):
        conf[DRIVER_OPTIONS] = f"{STREAM_GC_OPTION} {options}".strip()
    return config.model_copy(update={"spark": config.spark.model_copy(update={"conf": conf})})


def stream_needs(config: PipelineConfig) -> list[StreamNeed]:
    """Every stage's demand on the trigger. An equi stage that may run SSBJ (``ssbj``,
    ``meshjoin``, ``auto``) needs its R-cycle of k steps; a plain or theta stage one step."""
    interval = config.schedule.interval_delta
    needs = []
    for stage in config.stages:
        cyclic = isinstance(stage, EquiStage) and stage.operator.mode != "baseline"
        partitions = stage.operator.partitions if isinstance(stage, EquiStage) else None
        bound = stage.freshness.stream_bound(interval)
        needs.append(stream_need(stage.name, partitions if cyclic else None, bound))
    return needs


def resolve_trigger(config: PipelineConfig, trigger: timedelta | None) -> timedelta:
    """The stream's trigger: ``trigger`` (``--trigger``) if it keeps every stage's bound, or
    the longest that does; a ConfigError names the stage and the numbers."""
    needs = stream_needs(config)
    try:
        chosen = stream_trigger(needs, trigger)
    except ValueError as e:
        raise ConfigError(f"--trigger: {e}") from e
    tightest = min(needs, key=lambda n: n.longest_trigger)
    logger.info(
        "stream: a micro-batch every %ss%s; stage %s answers a tuple within %d triggers of "
        "its bound of %ss",
        f"{chosen.total_seconds():g}",
        "" if trigger is not None else " (derived from the freshness bounds)",
        tightest.stage,
        tightest.triggers,
        f"{tightest.bound.total_seconds():g}",
    )
    return chosen


@dataclass(frozen=True)
class StreamSettings:
    """How ``enrich stream`` runs: its trigger, and when it stops by itself."""

    trigger_seconds: float = 10.0
    idle_stop_seconds: float | None = None
    """Stop once nothing landed and nothing was pending for this long (None: never)."""
    max_seconds: float | None = None
    """Stop after this long (None: never)."""
    lease_wait_seconds: float = 600.0
    """How long a micro-batch waits for the lease a scheduled run holds."""


@dataclass
class StreamStats:
    """What the stream did, for its log and its caller."""

    micro_batches: int = 0
    ticks_skipped: int = 0
    last_activity: float = 0.0


class StreamService:
    """Runs the continuous mode's queries over one assembled pipeline."""

    def __init__(self, pipeline: PipelineContext, settings: StreamSettings) -> None:
        if settings.trigger_seconds <= 0:
            raise ConfigError(
                f"--trigger: expected a duration longer than zero, found "
                f"{settings.trigger_seconds}s"
            )
        self.pipeline = pipeline
        self.settings = settings
        self.stats = StreamStats(last_activity=time.monotonic())
        # Spark runs each query's foreachBatch on a thread of its own; the pipeline's
        # objects serve one command at a time.
        self._lock = threading.Lock()
        self._queries: list[StreamingQuery] = []
        self._stopping = threading.Event()
        self._busy = False  # a micro-step is under way
        self._first_tick = True
        self._zones: dict[str, LandingZone] = {
            name: zone_for(stream.landing, stream.format)
            for name, stream in pipeline.config.streams.items()
        }
        # What the landing zones held at the last listing: (stream, path, size, mtime).
        self._listed: frozenset[tuple[str, str, int, int]] = frozenset()

    # ------------------------------------------------------------------ the queries

    def start(self) -> None:
        """Start the clock query."""
        spark = self.pipeline.spark
        layout = self.pipeline.layout
        trigger = f"{self.settings.trigger_seconds:g} seconds"
        spark.streams.resetTerminated()  # an earlier stream's queries in this session ended
        clock = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
        self._queries.append(
            clock.writeStream.queryName("enrich_clock")
            .option("checkpointLocation", layout.stream_checkpoint(CLOCK))
            .trigger(processingTime=trigger)
            .foreachBatch(self._handler("stream-clock"))
            .start()
        )
        logger.info(
            "stream: %d quer(ies) started, a micro-batch every %s at most; checkpoints under %s",
            len(self._queries),
            trigger,
            layout.stream_checkpoint(""),
        )

    def run(self) -> StreamStats:
        """Start, then wait until a stop condition holds or a query fails; stop the queries."""
        self.start()
        started = watched = time.monotonic()
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                if now - watched >= WATCH_SECONDS:
                    self._raise_if_failed()
                    watched = now
                limit = self.settings.max_seconds
                if limit is not None and now - started >= limit:
                    logger.info("stream: ran %.0fs, stopping", now - started)
                    break
                idle = self.settings.idle_stop_seconds
                quiet = now - self.stats.last_activity
                # Idle only once the first tick, which always runs, has run: before it the
                # queries are still starting, and files that landed while the stream was
                # down wait for it (a stream stopped at 4 s with none run, in the soak).
                started_up = self.stats.micro_batches > 0
                if idle is not None and started_up and not self._busy and quiet >= idle:
                    logger.info("stream: idle for %.0fs, stopping", quiet)
                    break
                self._stopping.wait(TICK_SECONDS)
        finally:
            self.stop()
        self._raise_if_failed()
        return self.stats

    def stop(self) -> None:
        """Stop every query once the micro-batch under way has finished; a micro-batch
        that starts after this does nothing (the next start's first one does its work)."""
        self._stopping.set()
        with self._lock:  # waits for a micro-step under way
            pass
        for query in self._queries:
            if query.isActive:
                query.stop()

    def _raise_if_failed(self) -> None:
        for query in self._queries:
            failure = query.exception()
            if failure is not None:
                raise EnrichmentError(f"stream query {query.name} failed: {failure}")

    # ------------------------------------------------------------------ a micro-batch

    def _handler(self, prefix: str) -> Callable[[DataFrame, int], None]:
        def handle(batch: DataFrame, batch_id: int) -> None:
            while not self._lock.acquire(timeout=0.2):
                if self._stopping.is_set():
                    return
            try:
                if self._stopping.is_set():
                    return
                landed = self._files_landed()
                if not landed and not self._work_pending():
                    self.stats.ticks_skipped += 1
                    return
                self._busy = True
                self.micro_step(f"{prefix}-{batch_id}")
            finally:
                self._busy = False
                self._lock.release()

        return handle

    def _files_landed(self) -> bool:
        """Whether a landing zone lists a file, or a size or time, its last listing did
        not; the micro-step's ingest then takes what landed (through the ledger, with its
        quarantine and re-send rules) and what lands after this listing, the next tick."""
        listed = frozenset(
            (name, entry.path, entry.size_bytes, entry.mtime_ns)
            for name, zone in self._zones.items()
            for entry in zone.scan()[0]
        )
        landed = bool(listed - self._listed)
        self._listed = listed
        return landed

    def _work_pending(self) -> bool:
        """A stage's step is due without new files (``StageDriver.work_due``: SSBJ's H_S,
        a half-done step, late tuples whose master moved); or this is the process's first
        tick, which ingests what landed while no stream ran."""
        if self._first_tick:
            self._first_tick = False
            return True
        drivers = self.pipeline.runner.drivers
        return any(drivers.driver(stage).work_due() for stage in self.pipeline.config.stages)

    def micro_step(self, run_id: str) -> None:
        """Ingest, one step of every stage without closing, validate: one ledger run."""
        self.stats.last_activity = time.monotonic()
        pipeline = self.pipeline
        pipeline.runner.drivers.decide_again()
        with pipeline.exclusive(f"stream {run_id}", self.settings.lease_wait_seconds):
            code = pipeline.execute("stream", run_id)
        self.stats.micro_batches += 1
        self.stats.last_activity = time.monotonic()
        if code != 0:
            logger.warning("stream micro-batch %s ended with exit code %d", run_id, code)
