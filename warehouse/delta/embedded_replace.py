"""The embedded engine's replaces, overwrites and partition deletes through delta-rs, and
their conflict check.

They are optimistic: they remember the files in scope (the selected partitions, or the
whole table) at the version they opened, and commit only if every later commit left
exactly those files, schema and partitioning alone. Otherwise they raise
:class:`~common.errors.ConcurrentModificationError` and commit nothing, so a retry is
clean. A concurrent append into another partition does not conflict.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from deltalake import DeltaTable
from pyspark.sql.types import StructType

from common.errors import CommitError, ConcurrentModificationError, DeltaTableError
from common.faults import crash_point
from warehouse.delta.api import AppTransaction, CommitOutcome, PartitionFilter, describe_filters
from warehouse.delta.embedded_commits import Committer, find_commit, skip_if_committed
from warehouse.delta.embedded_predicates import delta_filters
from warehouse.delta.embedded_tip import Tip, commit_exists
from warehouse.delta.embedded_writes import Written
from warehouse.delta.schema import arrow_to_spark

logger = logging.getLogger(__name__)


def replace_at_tip(
    committer: Committer,
    root: str,
    tip: Tip,
    written: Written,
    schema: StructType | None,
    partitions: list[str],
    where: Sequence[PartitionFilter] | None,
    txn: AppTransaction | None,
    commit_id: str,
    operation: str,
) -> CommitOutcome:
    """delta-rs commits a replace of ``where`` (the whole table for None) asked at ``tip``
    (or, having lost the version, checks what changed since the tip and commits on the new
    version): from the files in scope at the tip. ``schema`` None is the table's there."""
    table = committer.tips.handle_at(root, tip)
    filters = delta_filters(where) if where else None
    return commit_replacing(
        committer,
        root,
        table,
        files_in_scope(root, table, filters),
        written,
        schema=arrow_to_spark(table.schema().to_arrow()) if schema is None else schema,
        partitions=partitions,
        filters=filters,
        txn=txn,
        commit_id=commit_id,
        operation=operation,
        scope=describe_filters(where) if where else "the whole table",
    )


def commit_replacing(
    committer: Committer,
    root: str,
    base: DeltaTable,
    replaced: frozenset[str],
    written: Written,
    *,
    schema: StructType,
    partitions: list[str],
    filters: list[tuple[str, str, Any]] | None,
    txn: AppTransaction | None,
    commit_id: str,
    operation: str,
    scope: str,
) -> CommitOutcome:
    """Commit an overwrite of ``filters`` only if nothing it replaces changed since ``base``.

    delta-rs (1.6) derives the Remove actions of ``mode="overwrite"`` from the snapshot
    of the handle it is called on. When that version is taken it retries at the next
    one, and its conflict check there only refuses concurrent removes of files it read:
    files appended meanwhile into the replaced partitions (or anywhere, for a
    whole-table overwrite) are not noticed, and their rows survive a replace that never
    saw them. So every attempt here is made on a handle opened at the latest version,
    after checking that the files in scope are still exactly those of ``base``, with
    delta-rs retries off; losing the version to a concurrent commit brings the loop
    back to the check.
    """
    base_version = base.version()
    attempts = committer.max_commit_retries + 1
    for attempt in range(1, attempts + 1):
        # The handle asked against, unless a newer version exists (its next commit
        # file says so, without opening the table again).
        newer = commit_exists(root, base_version + 1)
        # A handle of its own: ``base`` stays at the version the files in scope are of.
        current = committer.tips.open(root, held=False) if newer or attempt > 1 else base
        if current.version() != base_version:
            skipped = skip_if_committed(root, current, txn)
            if skipped:
                return skipped
            require_unchanged(
                root, base, current, replaced, filters, operation=operation, scope=scope
            )
        attempt_version = current.version()
        crash_point("delta.before_commit")
        committer.check_guard()
        try:
            committer.write_transaction(
                current,
                written,
                schema,
                partitions,
                committer.commit_properties(txn, commit_id, 0),
                mode="overwrite",
                filters=filters,
            )
        except Exception as e:  # noqa: BLE001 - delta-rs raises several unrelated types
            latest = committer.tips.open(root, held=False)  # ``base`` stays where it is
            if find_commit(latest, attempt_version, commit_id) is None and (
                latest.version() > attempt_version
            ):
                logger.info(
                    "%s of %s in %s lost version %d to a concurrent commit (attempt %d "
                    "of %d); checking the new version",
                    operation,
                    scope,
                    root,
                    attempt_version + 1,
                    attempt,
                    attempts,
                )
                continue
            return committer.recover_or_raise(
                root, attempt_version, commit_id, txn, e, written, operation
            )
        crash_point("delta.after_commit")
        return committer.landed(root, attempt_version, commit_id, written)
    raise CommitError(
        f"{operation} of {scope} in {root} did not land: {attempts} attempt(s) each lost "
        f"the next version to a concurrent commit (asked against version {base_version}). "
        "The written files stay untracked and are removed by vacuum; rerunning is safe."
    )


def files_in_scope(
    root: str, table: DeltaTable, filters: list[tuple[str, str, Any]] | None
) -> frozenset[str]:
    """The live files an overwrite of ``filters`` (all files for None) would remove."""
    try:
        if filters is None:
            return frozenset(table.file_uris())
        return frozenset(table.file_uris(file_pruning_predicate=filters))
    except Exception as e:
        raise DeltaTableError(
            f"cannot list the files of {root} at version {table.version()} matching {filters}: {e}"
        ) from e


def require_unchanged(
    root: str,
    base: DeltaTable,
    current: DeltaTable,
    replaced: frozenset[str],
    filters: list[tuple[str, str, Any]] | None,
    *,
    operation: str,
    scope: str,
) -> None:
    """Raise unless the commits after ``base`` left what the overwrite replaces alone."""
    base_version, current_version = base.version(), current.version()
    nothing = (
        "Nothing was committed; the written files stay untracked and are removed by "
        "vacuum. Rerun the operation against the new version."
    )
    if current.schema().to_json() != base.schema().to_json() or list(
        current.metadata().partition_columns
    ) != list(base.metadata().partition_columns):
        raise ConcurrentModificationError(
            f"{operation} of {scope} in {root}: the schema or partitioning changed "
            f"between version {base_version} (when the {operation} started) and version "
            f"{current_version}. {nothing}"
        )
    now = files_in_scope(root, current, filters)
    if now != replaced:
        raise ConcurrentModificationError(
            f"{operation} of {scope} in {root} conflicts with concurrent commits: between "
            f"version {base_version} (when the {operation} started) and version "
            f"{current_version}, {len(now - replaced)} file(s) were added to and "
            f"{len(replaced - now)} removed from what it replaces. {nothing}"
        )
    logger.info(
        "%s of %s in %s: versions %d..%d changed nothing it replaces; committing on %d",
        operation,
        scope,
        root,
        base_version + 1,
        current_version,
        current_version,
    )
