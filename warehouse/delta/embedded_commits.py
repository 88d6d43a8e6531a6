"""The embedded engine's commits: appends and app transactions, the commit files it writes
itself, and how a commit delta-rs made (or that raised) is found in the log.

An append or partition overwrite of a local table whose protocol asks a writer to honour
nothing beyond writer version 2 is committed by writing the commit file itself
(``log_writer``: the next version after the tip, created only if absent; a checkpoint
every ``delta.checkpointInterval`` versions), which costs a fraction of delta-rs's commit
and leaves the engine knowing the new version without reading it back. Everything else,
and a commit whose version another writer took, goes through delta-rs against the tip's
version. Every commit carries a fresh id in its commitInfo, and only the commit carrying
that id is reported as this engine's (``commit_protocol``). Replaces through delta-rs and
their conflict checks are :mod:`warehouse.delta.embedded_replace`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Literal

from deltalake import DeltaTable
from deltalake.transaction import CommitProperties, Transaction
from pyspark.sql.types import (
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from common.errors import CommitError
from common.faults import crash_point
from common.phase_clock import PhaseClock, optional_phase
from warehouse.delta.api import (
    CHECKPOINT_INTERVAL_PROPERTY,
    AppTransaction,
    CommitOutcome,
    DataFile,
    PartitionFilter,
)
from warehouse.delta.commit_file import CommitFile
from warehouse.delta.commit_protocol import (
    COMMIT_ID_KEY,
    CommitAttempt,
    already_recorded,
    outcome_after_error,
    tagged_metadata,
)
from warehouse.delta.embedded_reads import Snapshots
from warehouse.delta.embedded_tip import TableTips, Tip
from warehouse.delta.embedded_writes import Written
from warehouse.delta.log_writer import (
    LogFile,
    add_action,
    commit_info_action,
    remove_action,
    txn_action,
    writable,
    write_commit,
)
from warehouse.delta.partition_paths import delta_partition_literal
from warehouse.delta.schema import spark_to_arrow
from warehouse.object_store import storage_options

logger = logging.getLogger(__name__)

# delta-rs's default checkpoint interval (commits between checkpoints; delta-spark's is 10).
_CHECKPOINT_INTERVAL = 100
# Partition column types whose values a remove can name exactly as the log wrote them.
_REMOVABLE_PARTITION_TYPES = (ByteType, ShortType, IntegerType, LongType, StringType)


@dataclass(frozen=True)
class Committer:
    """How one engine call commits: the engine's tips and snapshots, its phase clock,
    commit guard and commit metadata as they are when the call starts."""

    tips: TableTips
    snapshots: Snapshots
    clock: PhaseClock | None
    check_guard: Callable[[], None]
    metadata: Mapping[str, str]
    max_commit_retries: int
    # Commit appends and partition overwrites by writing their commit files where the
    # table's protocol allows it; delta-rs otherwise.
    write_log: bool

    def commit_properties(
        self, txn: AppTransaction | None, commit_id: str, max_commit_retries: int
    ) -> CommitProperties:
        return CommitProperties(
            custom_metadata=tagged_metadata(self.metadata, commit_id),
            max_commit_retries=max_commit_retries,
            app_transactions=[Transaction(txn.app_id, txn.version)] if txn else None,
        )

    def write_transaction(
        self,
        table: DeltaTable,
        written: Written,
        schema: StructType,
        partitions: list[str],
        properties: CommitProperties,
        mode: Literal["append", "overwrite"] = "append",
        filters: list[tuple[str, str, Any]] | None = None,
    ) -> None:
        """Commit ``written``'s files with delta-rs (an overwrite replaces what ``filters``
        select, or the whole table without them); its time is the ``commit`` phase."""
        with optional_phase(self.clock, "commit"):
            table.create_write_transaction(
                list(written.adds),
                mode=mode,
                schema=spark_to_arrow(schema),
                partition_by=partitions or None,
                partition_filters=filters,
                commit_properties=properties,
            )

    def commit_append(
        self,
        root: str,
        tip: Tip,
        written: Written,
        schema: StructType,
        partitions: list[str],
        txn: AppTransaction | None,
        commit_id: str,
    ) -> CommitOutcome:
        """Commit Add actions after the tip's version: this engine writes the commit file
        where it may; otherwise (or when another writer took that version) delta-rs
        commits, retrying on a newer version (appends never conflict)."""
        if not written.adds and txn is None:
            return CommitOutcome(table_version=tip.table_version, committed=False)
        attempted = self.log_writable(root, tip, removes=False)
        if attempted:
            own = self.commit_own(root, tip, written, None, txn, commit_id)
            if own is not None:
                return own
        table = self.tips.handle_at(root, tip)
        base_version = table.version()
        if not attempted:  # a lost version's retry is the same commit: checked once
            crash_point("delta.before_commit")
            self.check_guard()
        try:
            self.write_transaction(
                table,
                written,
                schema,
                partitions,
                self.commit_properties(txn, commit_id, self.max_commit_retries),
            )
        except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
            return self.recover_or_raise(root, base_version, commit_id, txn, e, written, "append")
        crash_point("delta.after_commit")
        return self.landed(root, base_version, commit_id, written)

    def own_scope(
        self, root: str, tip: Tip, where: Sequence[PartitionFilter] | None
    ) -> tuple[DataFile, ...] | None:
        """The live files at the tip's version that a replace of ``where`` (the whole
        table for None) removes, when this engine can write that commit itself; None when
        delta-rs must: the log writer may not write this table, a partition column's values
        are not integers or strings, a filter is not ``=`` or ``in`` over non-null values of
        the column's type, or a file's log path is not known."""
        if not self.log_writable(root, tip, removes=True):
            return None
        types = {f.name: f.dataType for f in tip.schema.fields}
        if not all(isinstance(types[c], _REMOVABLE_PARTITION_TYPES) for c in tip.partition_columns):
            return None
        wanted: dict[str, frozenset[Any]] = {}
        for condition in where or ():
            values = list(condition.value) if condition.op == "in" else [condition.value]
            expected = str if isinstance(types[condition.column], StringType) else int
            if condition.op not in ("=", "in") or not all(
                # A bool is not an int here; "" is left to delta-rs, which reads it as null
                # (the log's files carry null, never "", for such a partition).
                type(v) is expected and v != ""
                for v in values
            ):
                return None
            allowed = frozenset(values)
            wanted[condition.column] = wanted.get(condition.column, allowed) & allowed
        files = self.snapshots.snapshot(root, tip.table_version).files
        if any(f.log_path is None for f in files):
            return None
        return tuple(
            f
            for f in files
            if all(f.partition_values.get(c) in allowed for c, allowed in wanted.items())
        )

    def log_writable(self, root: str, tip: Tip, removes: bool) -> bool:
        """Whether this engine writes the commit file of a commit to the table itself."""
        if not self.write_log:
            return False
        reason = writable(
            root,
            tip.min_writer_version,
            tip.writer_features,
            tip.properties,
            tip.schema_json,
            removes=removes,
        )
        if reason is not None:
            logger.debug("%s: delta-rs commits (the log writer does not write %s)", root, reason)
        return reason is None

    def commit_own(
        self,
        root: str,
        tip: Tip,
        written: Written,
        removed: Sequence[DataFile] | None,
        txn: AppTransaction | None,
        commit_id: str,
    ) -> CommitOutcome | None:
        """Commit ``written``'s adds and the removes of ``removed`` (None: an append) as the
        version after the tip, by writing its commit file (``log_writer``; the caller has
        checked :meth:`log_writable`), under the commit guard; None, having committed
        nothing, when another writer took that version (the caller then commits through
        delta-rs)."""
        version = tip.table_version + 1
        now_ms = int(datetime.now().timestamp() * 1000)
        metadata = tagged_metadata(self.metadata, commit_id)
        actions: list[dict[str, Any]] = [
            commit_info_action(
                now_ms,
                "Append" if removed is None else "Overwrite",
                tip.partition_columns,
                tip.table_version,
                blind_append=removed is None,
                metadata=metadata,
            )
        ]
        actions += [
            add_action(a.path, a.size, a.partition_values, a.modification_time, a.stats)
            for a in written.adds
        ]
        for file in removed or ():
            assert file.log_path is not None  # own_scope gives only files with one
            values = {
                c: delta_partition_literal(file.partition_values.get(c))
                for c in tip.partition_columns
            }
            actions.append(remove_action(LogFile(file.log_path, values, file.size_bytes), now_ms))
        if txn is not None:
            actions.append(txn_action(txn.app_id, txn.version, now_ms))
        crash_point("delta.before_commit")
        self.check_guard()
        try:
            with optional_phase(self.clock, "commit"):
                landed = write_commit(root, version, actions)
        except OSError as e:
            # The file may have been made visible before the error surfaced (a network file
            # system retrying the link): the version is ours only if it carries our id.
            landed = self.tips.commit_id_at(root, version) == commit_id
            if not landed:
                logger.warning(
                    "%s: cannot write commit file %d (%s); delta-rs commits", root, version, e
                )
                return None
        if not landed:
            logger.info(
                "%s: version %d was taken by another writer; delta-rs commits", root, version
            )
            return None
        crash_point("delta.after_commit")
        self._committed(root, tip, version, actions, txn)
        logger.info(
            "committed %d file(s), removed %d, to %s at version %d (commit %s)",
            len(written.adds),
            len(removed or ()),
            root,
            version,
            commit_id,
        )
        return written.outcome(version)

    def _committed(
        self,
        root: str,
        tip: Tip,
        version: int,
        actions: Sequence[Mapping[str, Any]],
        txn: AppTransaction | None,
    ) -> None:
        """What this engine knows after writing ``version`` itself: its commit file (so a
        snapshot replays the new version from the tip's without reading it back) and the
        new tip; a checkpoint every ``delta.checkpointInterval`` versions, as delta-rs's
        own commit makes one."""
        self.tips.commits.put(root, version, CommitFile(version, tuple(actions)))
        txns = dict(tip.txns) | ({txn.app_id: txn.version} if txn is not None else {})
        self.tips.hold(replace(tip, table_version=version, txns=txns))
        interval = _checkpoint_interval(tip.properties)
        if (version + 1) % interval == 0:  # delta-rs's cadence: versions 99, 199, ...
            try:
                checkpointed = DeltaTable(
                    root, version=version, storage_options=storage_options(root)
                )
                checkpointed.create_checkpoint()
                if tip.properties.get("delta.enableExpiredLogCleanup", "true").lower() != "false":
                    checkpointed.cleanup_metadata()
            except Exception as e:  # noqa: BLE001 - the commit landed; a checkpoint is an aid
                logger.warning("%s: checkpoint of version %d failed: %s", root, version, e)

    def landed(
        self, root: str, after_version: int, commit_id: str, written: Written
    ) -> CommitOutcome:
        """The outcome of a commit delta-rs reported as done, at the version that is ours:
        the next version's commit file when it carries our id (no table to open), else
        the log after ``after_version`` searched for it. The tip follows the new commit
        file at the next look (:meth:`~warehouse.delta.embedded_tip.TableTips.advanced`)."""
        version = after_version + 1
        if self.tips.commit_id_at(root, version) != commit_id:
            latest = self.tips.open(root)
            found = find_commit(latest, after_version, commit_id)
            if found is None:
                # Not expected: delta-rs returned without error. Report the newest version
                # rather than fail a commit that happened.
                logger.warning(
                    "commit %s to %s succeeded but is not in the log after version %d; "
                    "reporting the latest version %d",
                    commit_id,
                    root,
                    after_version,
                    latest.version(),
                )
                found = latest.version()
            version = found
        logger.info(
            "committed %d file(s) to %s at version %d (commit %s)",
            len(written.adds),
            root,
            version,
            commit_id,
        )
        return written.outcome(version)

    def recover_or_raise(
        self,
        root: str,
        after_version: int,
        commit_id: str,
        txn: AppTransaction | None,
        error: Exception,
        written: Written,
        operation: str,
    ) -> CommitOutcome:
        """Treat an error as success only if the log shows that OUR commit landed, as
        :func:`~warehouse.delta.commit_protocol.outcome_after_error` decides."""
        latest = self.tips.open(root, held=False)
        landed = find_commit(latest, after_version, commit_id)
        recovered = outcome_after_error(
            CommitAttempt(root, operation, commit_id, txn),
            error,
            ours=None if landed is None else written.outcome(landed),
            latest_version=latest.version(),
            recorded=latest.transaction_version,
        )
        if recovered is not None:
            return recovered
        raise CommitError(
            f"commit to {root} failed and did not land: {error}. The written files stay "
            "untracked and are removed by vacuum; rerunning the step is safe."
        ) from error


def skip_if_committed(
    root: str, table: DeltaTable | Tip, txn: AppTransaction | None
) -> CommitOutcome | None:
    """The outcome of a write whose app transaction ``table`` already records (nothing
    committed); None when it is to be written."""
    if txn is None:
        return None
    recorded = table.transaction_version(txn.app_id)
    if already_recorded(txn, recorded):
        logger.info(
            "skip commit to %s: app %s already at version %s (asked %s)",
            root,
            txn.app_id,
            recorded,
            txn.version,
        )
        return CommitOutcome(table_version=table.version(), committed=False)
    return None


def find_commit(latest: DeltaTable, after_version: int, commit_id: str) -> int | None:
    """The version after ``after_version`` whose commitInfo carries ``commit_id``."""
    newer = latest.version() - after_version
    if newer <= 0:
        return None
    for info in latest.history(newer):
        if info.get(COMMIT_ID_KEY) == commit_id and int(info["version"]) > after_version:
            return int(info["version"])
    return None


def _checkpoint_interval(properties: Mapping[str, str]) -> int:
    """``delta.checkpointInterval`` of a table (delta-rs's 100 by default)."""
    try:
        return max(1, int(properties.get(CHECKPOINT_INTERVAL_PROPERTY, _CHECKPOINT_INTERVAL)))
    except ValueError:
        return _CHECKPOINT_INTERVAL
