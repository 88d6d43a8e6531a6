"""The native engine's commit protocol: every delta-spark write as a tagged commit.

Each write carries a fresh commit id in its commitInfo ``userMetadata``; the outcome is
that of the commit carrying the id, never of a concurrent writer's. An error from
delta-spark is sorted into: our commit landed anyway, another writer recorded the same
app transaction, a conflict (nothing committed), or a failure.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from delta.exceptions.base import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)

from common.errors import CommitError, ConcurrentModificationError, DeltaTableError
from common.faults import crash_point
from common.phase_clock import optional_phase
from warehouse.delta.api import AppTransaction, CommitOutcome
from warehouse.delta.commit_protocol import (
    COMMIT_ID_KEY,
    CommitAttempt,
    outcome_after_error,
    tagged_metadata,
)
from warehouse.delta.native_jvm import JVM_ERRORS, jvm_message
from warehouse.delta.native_reads import NativeReads, tagged_user_metadata

logger = logging.getLogger(__name__)

USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"
_DML_TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
_DML_TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
_CONFLICTS: tuple[type[Exception], ...] = (
    DeltaConcurrentModificationException,
    ConcurrentWriteException,
    ConcurrentAppendException,
    ConcurrentDeleteReadException,
    ConcurrentDeleteDeleteException,
    MetadataChangedException,
    ProtocolChangedException,
)


class NativeCommits(NativeReads):
    """Commits through one delta-spark call each, and the session settings around them."""

    @contextmanager
    def _dml_settings(self, user_metadata: str, txn: AppTransaction | None) -> Iterator[None]:
        """Merge and delete take no writer options: their commitInfo.userMetadata and app
        transaction come from session settings, set only around the call."""
        settings = {USER_METADATA_CONF: user_metadata}
        if txn is not None:
            settings[_DML_TXN_APP_ID_CONF] = txn.app_id
            settings[_DML_TXN_VERSION_CONF] = str(txn.version)
        with self._session_settings(settings):
            yield

    @contextmanager
    def _session_settings(self, settings: Mapping[str, str]) -> Iterator[None]:
        previous: dict[str, str | None] = {k: self._spark.conf.get(k, None) for k in settings}
        for key, value in settings.items():
            self._spark.conf.set(key, value)
        try:
            yield
        finally:
            for key, old in previous.items():
                if old is None:
                    self._spark.conf.unset(key)
                else:
                    self._spark.conf.set(key, old)

    # ------------------------------------------------------------------ commit protocol

    def _commit(
        self,
        root: str,
        operation: str,
        scope: str,
        txn: AppTransaction | None,
        save: Callable[[str], None],
    ) -> CommitOutcome:
        """Run ``save`` (one delta-spark call that writes and commits) as our tagged commit.

        ``save`` gets the commit's ``userMetadata``: a JSON object holding a fresh commit id
        and ``commit_metadata``. The outcome reports the commit carrying that id, never
        merely "the table moved on".
        """
        # No look-up of the app transaction here: delta-spark checks txnAppId/txnVersion
        # itself, inside the same transaction as the write, and skips a recorded one before
        # writing any data. Checking first as well cost a second read of the version's
        # checksum (about 2 s a commit on local[2]) and could not close the race anyway.
        before = self._latest_version(root)
        commit_id = self._new_commit_id()
        user_metadata = json.dumps(tagged_metadata(self.commit_metadata, commit_id), sort_keys=True)
        self._check_commit_guard()
        crash_point("delta.before_commit")
        try:
            with optional_phase(self.clock, "write"):  # delta-spark writes and commits in one
                save(user_metadata)
        except JVM_ERRORS as e:
            return self._recover_or_raise(root, before, commit_id, txn, operation, scope, e)
        crash_point("delta.after_commit")
        landed = self._find_commit(root, before, commit_id)
        if landed is None:
            # delta-spark skipped the write: the app transaction was already recorded, by an
            # earlier attempt of this run or by another writer.
            latest = self._latest_version(root)
            logger.info(
                "skip %s on %s: the app transaction %s is already recorded (table at version %d)",
                operation,
                root,
                txn,
                latest,
            )
            return CommitOutcome(table_version=latest, committed=False)
        logger.info(
            "%s on %s committed version %d (commit %s)", operation, root, landed[0], commit_id
        )
        return _outcome(landed[0], landed[1])

    def _find_commit(
        self, root: str, after_version: int, commit_id: str
    ) -> tuple[int, Mapping[str, Any]] | None:
        """(version, commit metrics) of the commit after ``after_version`` carrying the id.

        Reads the commitInfo actions of the newer commits straight from the log (history()
        would build a DataFrame per call).
        """
        latest = self._latest_version(root)
        if latest <= after_version:
            return None
        commits = self._log(root).getChanges(after_version + 1, latest, self._none(), False)
        while commits.hasNext():
            commit = commits.next()
            for action in self._java_list(commit._2()):
                if action.getClass().getSimpleName() != "CommitInfo":
                    continue
                tagged = action.userMetadata()
                if (
                    tagged.isEmpty()
                    or tagged_user_metadata(tagged.get()).get(COMMIT_ID_KEY) != commit_id
                ):
                    continue
                metrics = action.operationMetrics()
                entry = {
                    "operationMetrics": {}
                    if metrics.isEmpty()
                    else {
                        str(k): str(v)
                        for k, v in self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(
                            metrics.get()
                        ).items()
                    }
                }
                return int(commit._1()), entry
        return None

    def _recover_or_raise(
        self,
        root: str,
        before: int,
        commit_id: str,
        txn: AppTransaction | None,
        operation: str,
        scope: str,
        error: Exception,
    ) -> CommitOutcome:
        """An error from delta-spark: our commit landed anyway, another writer's commit of
        the same app transaction won, a conflict (nothing committed), or a failure."""
        landed = self._find_commit(root, before, commit_id)
        latest = self._jsnapshot(root)
        recovered = outcome_after_error(
            CommitAttempt(root, operation, commit_id, txn),
            error,
            ours=None if landed is None else _outcome(*landed),
            latest_version=int(latest.version()),
            recorded=lambda app_id: self._recorded(latest, app_id),
        )
        if recovered is not None:
            return recovered
        if isinstance(error, ConcurrentTransactionException):
            raise CommitError(
                f"{operation} on {root} did not land: a concurrent writer committed app "
                f"transaction {txn}, but the table does not record it: {jvm_message(error)}"
            ) from error
        if isinstance(error, _CONFLICTS):
            raise ConcurrentModificationError(
                f"{operation} of {scope} in {root} conflicts with a commit made after version "
                f"{before} (the table is now at version {int(latest.version())}): "
                f"{jvm_message(error)}. Nothing was committed; rerun the operation against the "
                "new version."
            ) from error
        text = jvm_message(error)
        if "REPLACE_WHERE_MISMATCH" in text:
            raise DeltaTableError(
                f"{operation} on {root}: the data has rows outside the replace predicate "
                f"{scope}; nothing was committed ({text})"
            ) from error
        raise CommitError(
            f"{operation} on {root} failed and did not land (table still at version "
            f"{int(latest.version())}): {text}. Rerunning is safe."
        ) from error


def _outcome(version: int, entry: Mapping[str, Any]) -> CommitOutcome:
    """The outcome of our commit, with its data volume from delta-spark's metrics."""
    metrics = {k: int(v) for k, v in (entry.get("operationMetrics") or {}).items() if _int(v)}

    def first(*names: str) -> int:
        return next((metrics[n] for n in names if n in metrics), 0)

    rows = first("numOutputRows") or sum(
        metrics.get(n, 0)
        for n in ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsCopied")
    )
    return CommitOutcome(
        table_version=version,
        committed=True,
        files_added=first("numFiles", "numTargetFilesAdded", "numAddedFiles"),
        bytes_added=first("numOutputBytes", "numTargetBytesAdded", "numAddedBytes"),
        rows_added=rows or first("numCopiedRows"),
    )


def _int(value: Any) -> bool:
    try:
        int(value)
    except (TypeError, ValueError):
        return False
    return True
