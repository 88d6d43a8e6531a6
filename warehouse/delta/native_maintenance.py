"""The native engine's maintenance: delta-spark's OPTIMIZE and VACUUM.

delta-spark has no list of versions for VACUUM to keep, so the retention is stretched to
cover every commit after the oldest version the pipeline pins.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from common.sql_text import quoted_identifier
from warehouse.delta.commit_protocol import tagged_metadata
from warehouse.delta.native_commits import USER_METADATA_CONF, NativeCommits
from warehouse.delta.table_paths import table_root

logger = logging.getLogger(__name__)

_RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
_OPTIMIZE_MAX_FILE_CONF = "spark.databricks.delta.optimize.maxFileSize"
_LISTING_PARALLELISM_CONF = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
# Files removed by the commit after the oldest pinned version are a little older than that
# commit; vacuum keeps this much more.
PIN_MARGIN_HOURS = 1.0


class NativeMaintenance(NativeCommits):
    """Compaction's bin packing and vacuum."""

    def _bin_pack(self, root: str, target_file_bytes: int) -> tuple[int, Mapping[str, Any]]:
        """delta-spark's ``OPTIMIZE``, with this engine's commit metadata as the commit's
        userMetadata."""
        before = self._latest_version(root)
        self._check_commit_guard()
        settings = {
            _OPTIMIZE_MAX_FILE_CONF: str(target_file_bytes),
            USER_METADATA_CONF: json.dumps(
                tagged_metadata(self.commit_metadata, self._new_commit_id()), sort_keys=True
            ),
        }
        table = "delta." + quoted_identifier(root)
        with self._session_settings(settings):
            row = self._spark.sql(f"OPTIMIZE {table}").collect()[0]
        return before, row["metrics"]

    def vacuum(
        self, path: str, retention_hours: float, keep_versions: Sequence[int] = ()
    ) -> list[str]:
        """Delete files no version within the retention needs, and untracked files older
        than it (delta-spark's FULL vacuum); return the files deleted.

        delta-spark has no list of versions to keep, so the retention is stretched to cover
        every commit after the oldest kept version: the files those commits removed stay,
        and every kept version stays readable. delta-spark records the vacuum as two
        commits (``VACUUM START`` / ``VACUUM END``).
        """
        root = table_root(path)
        latest = self._latest_version(root)
        hours = float(retention_hours)
        kept = [v for v in keep_versions if v < latest]
        if kept:
            oldest = min(kept)
            successor = [h for h in self.history(root) if int(h["version"]) == oldest + 1]
            if successor:
                age_ms = datetime.now(UTC).timestamp() * 1000 - int(successor[0]["timestamp"])
                needed = age_ms / 3_600_000 + PIN_MARGIN_HOURS
                if needed > hours:
                    logger.info(
                        "vacuum %s: retention stretched from %gh to %.3fh to keep version %d",
                        root,
                        hours,
                        needed,
                        oldest,
                    )
                    hours = needed
        table = "delta." + quoted_identifier(root)
        before = self._table_files(root)
        settings = {
            _RETENTION_CHECK_CONF: "false",
            # delta-spark lists the table with this many tasks (Spark's default: 10000).
            _LISTING_PARALLELISM_CONF: str(max(1, self._spark.sparkContext.defaultParallelism)),
        }
        with self._session_settings(settings):
            self._spark.sql(f"VACUUM {table} RETAIN {hours:.6f} HOURS").collect()
        deleted = sorted(before - self._table_files(root))
        logger.info("vacuumed %s: %d file(s) deleted", root, len(deleted))
        return deleted

    def _table_files(self, root: str) -> set[str]:
        """Every file under the table's root except its log (data, change data, untracked)."""
        hadoop = self._jvm.org.apache.hadoop.fs.Path(root)
        filesystem = hadoop.getFileSystem(self._spark._jsc.hadoopConfiguration())
        base = str(filesystem.makeQualified(hadoop).toUri().getPath()).rstrip("/")
        found = set()
        listing = filesystem.listFiles(hadoop, True)
        while listing.hasNext():
            location = str(listing.next().getPath().toUri().getPath())
            relative = location[len(base) :].lstrip("/")
            if not relative.startswith("_delta_log/"):
                found.add(location)
        return found
