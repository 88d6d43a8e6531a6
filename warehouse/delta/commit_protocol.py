"""The exactly-once commit protocol both engines keep: commit ids, and what a failed commit
call did.

Every commit an engine makes carries a fresh id (``COMMIT_ID_KEY``) next to the caller's
``commit_metadata``: the only proof that a commit in the log is ours, since another writer
running the same step records the same app transaction. When a commit call raises, the
log decides what happened, in this order (the invariants of :mod:`warehouse.delta.api`):

1. our commit is in the log: it landed, whatever the error said (a post-commit hook, a
   lost reply), and is reported as ours, not retried;
2. the log records the app transaction at its version or later: another writer's commit
   holds the step's rows, so the outcome is ``committed=False``;
3. otherwise nothing landed, and the engine raises its own error.

How the log is read (delta-rs or delta-spark's JVM classes) stays in each engine; the
decision is made here once.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from common.errors import ConfigError
from warehouse.delta.api import AppTransaction, CommitOutcome

logger = logging.getLogger(__name__)

# commitInfo key holding the unique id of each commit an engine makes (the native engine
# keeps it in the commit's ``userMetadata`` JSON; its history lifts it to the same key).
COMMIT_ID_KEY = "enrichment.commitId"


def new_commit_id(
    commit_metadata: Mapping[str, str], reserved: frozenset[str] = frozenset({COMMIT_ID_KEY})
) -> str:
    """A fresh commit id; refuses ``commit_metadata`` that would shadow a ``reserved`` key
    (the engine writes those itself, and the commit id must stay this commit's own)."""
    clashing = sorted(set(commit_metadata) & reserved)
    if clashing:
        raise ConfigError(
            f"commit metadata keys must not be reserved commitInfo keys {sorted(reserved)}: "
            f"the engine writes them into every commit itself; got {clashing}"
        )
    return uuid.uuid4().hex


def tagged_metadata(commit_metadata: Mapping[str, str], commit_id: str) -> dict[str, str]:
    """What a commit records besides its actions: the caller's metadata and its own id."""
    return {**commit_metadata, COMMIT_ID_KEY: commit_id}


def already_recorded(txn: AppTransaction | None, recorded: int | None) -> bool:
    """True when a table that records ``txn``'s app id at ``recorded`` already holds ``txn``."""
    return txn is not None and recorded is not None and recorded >= txn.version


@dataclass(frozen=True)
class CommitAttempt:
    """A commit an engine tried: ``operation`` on the table at ``root``, carrying
    ``commit_id`` and, for an idempotent write, ``txn``."""

    root: str
    operation: str
    commit_id: str
    txn: AppTransaction | None


def outcome_after_error(
    attempt: CommitAttempt,
    error: Exception,
    *,
    ours: CommitOutcome | None,
    latest_version: int,
    recorded: Callable[[str], int | None],
) -> CommitOutcome | None:
    """What a commit call that raised ``error`` did, as the log tells it after the error.

    ``ours`` is the outcome of the commit carrying ``commit_id`` if the log has it,
    ``latest_version`` the table's newest version and ``recorded`` the version the log
    records for an app id. None: nothing landed, and the caller raises.
    """
    operation, root, commit_id, txn = (
        attempt.operation,
        attempt.root,
        attempt.commit_id,
        attempt.txn,
    )
    if ours is not None:
        logger.warning(
            "%s on %s (commit %s) raised %s after it landed at version %d; not retrying",
            operation,
            root,
            commit_id,
            _summary(error),
            ours.table_version,
        )
        return ours
    if txn is None:
        return None
    recorded_version = recorded(txn.app_id)
    if not already_recorded(txn, recorded_version):
        return None
    logger.warning(
        "%s on %s (commit %s) did not land (%s): another writer's commit recorded app %s at "
        "version %s (asked %s); files this write made stay untracked for vacuum",
        operation,
        root,
        commit_id,
        _summary(error),
        txn.app_id,
        recorded_version,
        txn.version,
    )
    return CommitOutcome(table_version=latest_version, committed=False)


def _summary(error: BaseException) -> str:
    """The error's type and first line: a JVM error's text runs on with its stack trace,
    which stays on the exception chain."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
