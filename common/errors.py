"""Domain errors of the enrichment pipeline.

Every error raised on purpose by this product derives from :class:`EnrichmentError`, so a
caller (the CLI, an Airflow task) can tell "the input or configuration is wrong" apart from a
bug. Messages say what was expected and what was found, and name the table, file or key.
"""

from __future__ import annotations


class EnrichmentError(Exception):
    """Base class of every error this product raises deliberately."""

    exit_code = 1


class ConfigError(EnrichmentError):
    """The pipeline configuration is invalid (bad key, bad value, dangling reference)."""

    exit_code = 2


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


class NotAppendOnlyError(DeltaTableError):
    """Changes between versions were asked of a table that rewrote files and has no CDF."""


class StateStoreError(EnrichmentError):
    """The pipeline state store is unreachable or holds contradictory data."""


class IngestionError(EnrichmentError):
    """A landing-zone file cannot be ingested."""


class ChangedFileError(IngestionError):
    """A file was re-delivered under a known name with different content."""


class SchemaDriftError(IngestionError):
    """A landing file's columns do not match the stream's declared schema."""


class JoinError(EnrichmentError):
    """A join operator was given inputs or parameters it cannot honour."""


class ValidationFailedError(EnrichmentError):
    """A quality suite failed and the suite is not warn-only."""

    exit_code = 3
