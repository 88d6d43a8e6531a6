"""Prepare the demo: TPC-H masters as Delta tables and stream files in an outbox.

The outbox and the TPC-H cache live next to a local warehouse root (``<root>/../outbox`` and
``<root>/../tpch``), or in the driver's local folder when the root is in an object store.
``outbox/manifest.json`` lists the interval starts, so the demo driver
knows which files to deliver before which DAG run.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common.errors import ConfigError
from demo.data import (
    DemoSpec,
    generate_tpch,
    interval_starts,
    master_tables,
    stream_batches,
    write_outbox,
)
from pipeline.config import PipelineConfig
from pipeline.context import PipelineContext
from warehouse.delta.api import CDF_PROPERTY
from warehouse.delta.schema import arrow_to_spark
from warehouse.object_store import is_object_store

logger = logging.getLogger(__name__)

MASTER_FILES = 8


def demo_folder(config: PipelineConfig) -> Path:
    """Where the outbox and the TPC-H cache go: beside a local warehouse root, in the
    driver's local folder when the root is in an object store."""
    if is_object_store(config.warehouse.root):
        return Path(config.warehouse.driver_root())
    return Path(config.warehouse.root).parent


def prepare_demo(
    pipeline: PipelineContext,
    scale: float,
    intervals: int,
    zipf: float,
    first_interval: datetime | None = None,
) -> DemoSpec:
    config = pipeline.config
    step = config.schedule.interval_delta
    if first_interval is None:
        now = datetime.now(UTC).replace(tzinfo=None)
        first_interval = _floor(now, step) - intervals * step
    spec = DemoSpec(
        scale=scale,
        intervals=intervals,
        first_interval=first_interval.replace(tzinfo=None),
        interval=step,
        zipf_z=zipf,
    )
    folder = demo_folder(config)
    tpch = generate_tpch(scale, folder / "tpch")
    for name, table in master_tables(tpch, spec.seed).items():
        if name not in config.masters:
            continue
        path = pipeline.layout.master(config, name)
        if pipeline.engine.exists(path):
            logger.info("master %s exists at %s; kept", name, path)
            continue
        schema = arrow_to_spark(table.schema)
        # The SSBJ cache catches up with master changes through the change data feed.
        pipeline.engine.create_table(path, schema, properties={CDF_PROPERTY: "true"})
        frame = pipeline.spark.createDataFrame(table, schema).repartition(MASTER_FILES)
        pipeline.engine.append(path, frame)
        logger.info("master %s: %d rows at %s", name, table.num_rows, path)
    unknown = [s for s in config.streams if s not in ("orders", "lineitem")]
    if unknown:
        raise ConfigError(f"demo-data generates streams orders and lineitem, not {unknown}")
    outbox = folder / "outbox"
    batches = stream_batches(tpch, spec)
    write_outbox(
        {k: v for k, v in batches.items() if k in config.streams}, outbox, spec.files_per_interval
    )
    manifest = {
        "intervals": [s.isoformat() for s in interval_starts(spec)],
        "interval_seconds": step.total_seconds(),
        "streams": list(config.streams),
        "scale": scale,
        "zipf": zipf,
    }
    (outbox / "manifest.json").write_text(json.dumps(manifest, indent=2))
    logger.info("demo outbox ready: %d interval(s) from %s", intervals, first_interval)
    return spec


def _floor(moment: datetime, step: timedelta) -> datetime:
    epoch = datetime(1970, 1, 1)
    seconds = int((moment - epoch).total_seconds())
    return epoch + timedelta(seconds=seconds - seconds % int(step.total_seconds()))
