"""Domain errors of the enrichment pipeline.

Every error raised on purpose by this product derives from :class:`EnrichmentError`, so a
caller (the CLI, an Airflow task) can tell "the input or configuration is wrong" apart from a
bug. Messages say what was expected and what was found, and name the table, file or key.
"""

from __future__ import annotations

# The exit codes of every ``enrich`` command, one place for the CLI, the Airflow glue and
# the errors that carry them: 4 = done, but some landing files were rejected.
EXIT_OK, EXIT_ERROR, EXIT_CONFIG, EXIT_VALIDATION, EXIT_PARTIAL, EXIT_BUSY = 0, 1, 2, 3, 4, 5


class EnrichmentError(Exception):
    """Base class of every error this product raises deliberately."""

    exit_code = EXIT_ERROR


class ConfigError(EnrichmentError):
    """The pipeline configuration is invalid (bad key, bad value, dangling reference)."""

    exit_code = EXIT_CONFIG


class DeltaTableError(EnrichmentError):
    """A Delta table cannot be used the way the caller asked."""


class TableNotFoundError(DeltaTableError):
    """The table does not exist at the given path."""


class TableExistsError(DeltaTableError):
    """A table was to be created where one already exists with a different definition."""


class SchemaMismatchError(DeltaTableError):
    """Data written to a table does not have the table's schema."""


class UnsupportedTableFeatureError(DeltaTableError):
    """The table uses a Delta reader feature this engine cannot honour."""


class UnsupportedOperationError(DeltaTableError):
    """The engine cannot perform this operation with these arguments."""


class CommitError(DeltaTableError):
    """A commit failed and did not land (conflict, storage error)."""


class ConcurrentModificationError(CommitError):
    """A concurrent commit changed what a replace, overwrite or delete was computed from.

    Nothing was committed; rerunning the operation against the new table version is safe.
    """


class NotAppendOnlyError(DeltaTableError):
    """Changes between versions were asked of a table that rewrote files and has no CDF."""


class StateStoreError(EnrichmentError):
    """The pipeline state store is unreachable or holds contradictory data."""


class DuplicateRecordError(StateStoreError):
    """A row was to be added to the state store under a key that is already recorded."""


class LeaseHeldError(StateStoreError):
    """Another run holds the pipeline's lease, and it was not freed within the wait."""

    exit_code = EXIT_BUSY


class LeaseLostError(StateStoreError):
    """This run's lease was taken over by another run; it must stop writing."""


class IngestionError(EnrichmentError):
    """A landing-zone file cannot be ingested."""


class ChangedFileError(IngestionError):
    """A file was re-delivered under a known name with different content."""


class SchemaDriftError(IngestionError):
    """A landing file's columns do not match the stream's declared schema."""


class RefusedFileError(IngestionError):
    """A landing-zone entry is not a regular file inside the landing directory (a symlink,
    a FIFO or device, or a path that resolves elsewhere), so it is never read."""


class UnreadableFileError(IngestionError):
    """A landing file cannot be read as its declared format (empty, truncated, corrupt)."""


class LedgerOrderError(IngestionError):
    """A landing file can no longer commit under its ledger id: a later id already has."""


class JoinError(EnrichmentError):
    """A join operator was given inputs or parameters it cannot honour."""


class BackfillIncompleteError(EnrichmentError):
    """A backfill started and did not finish; publishing waits until it is rerun."""


class ValidationFailedError(EnrichmentError):
    """A quality suite failed and the suite is not warn-only."""

    exit_code = EXIT_VALIDATION


class SparkServerError(EnrichmentError):
    """The Spark Connect server did not start, or stopped while it was needed."""
