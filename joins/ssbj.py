"""SSBJ and MESHJOIN as pure DataFrame transforms (seeds/ssbj_semi_stream_balanced_join.txt).

The stateful driver (``pipeline.ssbj_stage``) reads the operator's Delta tables, calls these
transforms and writes the results. Here:

- :func:`probe_cache` is the cache phase (Algorithm 1, lines 15–23): tuples whose join value
  is cached are joined completely with the cache H_R; the rest become the new H_S chunk.
- :func:`disk_join` is one MESHJOIN disk step (lines 24–27): every pending tuple meets the
  rows of one master partition of the version it is pinned to.
- :func:`master_row_counts`, :func:`switch_candidates` and :func:`eviction_victims` are the
  instrumentation and the cache inequality (lines 28–36, 42–51) in Spark expressions; they
  mirror ``cache.inequality`` (a property test checks that they agree).
- :func:`apply_master_changes` keeps cached rows at the master version in force.
- :func:`scan_rows` assigns master rows to the k partitions of the cyclic scan.

Every enriched row has the input's columns, then the master's projected columns, then the
master version column; unmatched rows of left joins carry nulls there, like the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from cache.inequality import EVICTION_PERIOD_CYCLES, TupleSizes
from joins.columns import version_column

PENDING_ID = "_pending_id"
ENTRY_STEP = "_entry_step"
PINNED_VERSION = "_pinned_version"
INPUT_VERSION = "_input_version"
EMPTY = "_empty"
STEP = "_step"
KIND = "_kind"
COUNT = "_count"
SCAN_PART = "_scan_part"
HIT, MASTER_ROWS = "hit", "master_rows"
OPERATOR_COLUMNS = (ENTRY_STEP, PENDING_ID, PINNED_VERSION, INPUT_VERSION)


@dataclass(frozen=True)
class JoinSpec:
    """What an SSBJ stage joins: key columns on both sides, master projection, join type."""

    stream_keys: tuple[str, ...]
    master_keys: tuple[str, ...]
    master_columns: tuple[str, ...]
    master_name: str
    how: str

    @property
    def version(self) -> str:
        return version_column(self.master_name)

    def master_keys_as_stream(self) -> list[Column]:
        """Master key columns renamed to the stream's key names."""
        pairs = zip(self.stream_keys, self.master_keys, strict=True)
        return [F.col(m).alias(s) for s, m in pairs]

    def stream_keys_as_master(self) -> list[Column]:
        """Stream key columns renamed to the master's key names."""
        pairs = zip(self.stream_keys, self.master_keys, strict=True)
        return [F.col(s).alias(m) for s, m in pairs]


def scan_rows(master_rows: DataFrame, spec: JoinSpec, partitions: int) -> DataFrame:
    """Projected master rows with their scan partition ``hash(row) mod k`` (MESHJOIN's R_p).

    A hash of the whole row, not of the join key: partition sizes stay within a few percent
    of |R|/k for any key skew (a key's rows spread over partitions, as in MESHJOIN, where a
    pending tuple meets every partition anyway). Deterministic, so a rerun recomputes the
    same partitions.
    """
    columns = [F.col(c) for c in spec.master_columns]
    part = F.pmod(F.xxhash64(*columns), F.lit(partitions)).cast(T.IntegerType())
    return master_rows.select(*columns, part.alias(SCAN_PART))


def _on(spec: JoinSpec) -> Column:
    terms = [
        F.col(f"s.`{s}`") == F.col(f"r.`{m}`")
        for s, m in zip(spec.stream_keys, spec.master_keys, strict=True)
    ]
    return reduce(lambda a, b: a & b, terms)


def _stream_columns(frame: DataFrame) -> list[str]:
    return [c for c in frame.columns if c not in OPERATOR_COLUMNS]


def enriched(stream: DataFrame, master: DataFrame, spec: JoinSpec, version: Column) -> DataFrame:
    """Inner-join stream rows to master rows and lay out the output columns."""
    # Aliases, not DataFrame-bound columns: both sides may derive from one lineage.
    joined = stream.alias("s").join(master.alias("r"), _on(spec), "inner")
    return joined.select(
        *[F.col(f"s.`{c}`").alias(c) for c in _stream_columns(stream)],
        *[F.col(f"r.`{c}`").alias(c) for c in spec.master_columns],
        version.cast(T.LongType()).alias(spec.version),
    )


def unmatched(stream: DataFrame, master_schema: T.StructType, spec: JoinSpec) -> DataFrame:
    """Stream rows with null master columns: left-join output of tuples with no match."""
    return stream.select(
        *[F.col(c) for c in _stream_columns(stream)],
        *[F.lit(None).cast(master_schema[c].dataType).alias(c) for c in spec.master_columns],
        F.lit(None).cast(T.LongType()).alias(spec.version),
    )


def probe_cache(
    stream: DataFrame, cache: DataFrame, spec: JoinSpec, cache_version: int
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Cache phase: (output rows served by H_R, misses for H_S, hit counts per join value).

    ``cache`` holds every master row of each cached value, and one ``_empty`` row for a
    cached value without master rows, so a cached miss-everything key is served too.
    """
    cached_keys = cache.select(*spec.master_keys_as_stream()).distinct()
    hits = stream.join(cached_keys, list(spec.stream_keys), "left_semi")
    misses = stream.join(cached_keys, list(spec.stream_keys), "left_anti")
    rows = cache.where(~F.col(EMPTY)).drop(EMPTY)
    served = enriched(hits, rows, spec, F.lit(cache_version))
    if spec.how == "left":
        empty_keys = cache.where(F.col(EMPTY)).select(*spec.master_keys_as_stream())
        nothing = hits.join(empty_keys, list(spec.stream_keys), "left_semi")
        served = served.unionByName(unmatched(nothing, cache.schema, spec))
    counts = hits.groupBy(*spec.stream_keys).agg(F.count(F.lit(1)).alias(COUNT))
    return served, misses, counts


def disk_join(pending: DataFrame, partition_rows: DataFrame, spec: JoinSpec) -> DataFrame:
    """One MESHJOIN step for tuples pinned to the version ``partition_rows`` comes from."""
    return enriched(pending, partition_rows, spec, F.col(f"s.`{PINNED_VERSION}`"))


def matched_ids(pending: DataFrame, partition_rows: DataFrame, spec: JoinSpec) -> DataFrame:
    """(entry step, pending id) of the pending tuples that matched in this step."""
    keys = partition_rows.select(*spec.master_keys_as_stream()).distinct()
    return pending.join(keys, list(spec.stream_keys), "left_semi").select(ENTRY_STEP, PENDING_ID)


def never_matched(expiring: DataFrame, matched: DataFrame) -> DataFrame:
    """Expiring tuples that met no master row during their whole R-cycle."""
    return expiring.join(matched, [ENTRY_STEP, PENDING_ID], "left_anti")


def master_row_counts(
    partition_rows: DataFrame, pending_keys: DataFrame, spec: JoinSpec
) -> DataFrame:
    """Incrementing state (line 29): master rows in this partition per pending join value.

    Every pending value gets a row, 0 when the partition has none of its rows, so that the
    switching decision knows which values were observed and for how many partitions.
    """
    renamed = partition_rows.select(*spec.master_keys_as_stream())
    counts = renamed.groupBy(*spec.stream_keys).agg(F.count(F.lit(1)).alias(COUNT))
    return pending_keys.join(counts, list(spec.stream_keys), "left").select(
        *spec.stream_keys, F.coalesce(F.col(COUNT), F.lit(0)).cast(T.LongType()).alias(COUNT)
    )


def switch_candidates(
    pending: DataFrame,
    master_counts: DataFrame,
    cached_keys: DataFrame,
    spec: JoinSpec,
    sizes: TupleSizes,
    switch_factor: float,
    partitions: int = 1,
    estimator: str = "paper",
) -> DataFrame:
    """Switching state (line 33): values with ``|H_S(j)|·v_S > s_f·s_count(j)·v_R``.

    ``paper``: s_count(j) is the sum of rows counted while j was pending, 0 if it never was
    (Algorithm 1 as written; a value that became pending after the incrementing cycle then
    looks like a value without master rows). ``extrapolated``: the sum is scaled by
    k / (partitions observed), and values never observed are not switched this cycle.
    """
    pending_counts = pending.groupBy(*spec.stream_keys).agg(F.count(F.lit(1)).alias("_pending"))
    counted = master_counts.groupBy(*spec.stream_keys).agg(
        F.sum(COUNT).alias("_rows"), F.count(F.lit(1)).alias("_observed")
    )
    how = "inner" if estimator == "extrapolated" else "left"
    joined = pending_counts.join(counted, list(spec.stream_keys), how).join(
        cached_keys, list(spec.stream_keys), "left_anti"
    )
    rows = F.coalesce(F.col("_rows"), F.lit(0))
    if estimator == "extrapolated":
        rows = rows * F.lit(float(partitions)) / F.col("_observed")
    m_disk = F.col("_pending") * F.lit(sizes.stream_bytes)
    m_cache = rows * F.lit(sizes.master_bytes)
    return joined.where(m_disk > F.lit(switch_factor) * m_cache).select(*spec.stream_keys)


def eviction_victims(
    cache: DataFrame,
    hit_counts: DataFrame,
    spec: JoinSpec,
    sizes: TupleSizes,
    switch_factor: float,
    period_cycles: int = EVICTION_PERIOD_CYCLES,
) -> DataFrame:
    """Eviction (line 46): values with ``|H_R(j)|·v_R >= s_f·f_count(j)/10·v_S``."""
    keyed = cache.select(
        *spec.master_keys_as_stream(),
        F.when(F.col(EMPTY), 0).otherwise(1).alias("_row"),
    )
    rows = keyed.groupBy(*spec.stream_keys).agg(F.sum("_row").alias("_rows"))
    hits = hit_counts.groupBy(*spec.stream_keys).agg(F.sum(COUNT).alias("_hits"))
    joined = rows.join(hits, list(spec.stream_keys), "left")
    m_cache = F.col("_rows") * F.lit(sizes.master_bytes)
    m_disk = F.coalesce(F.col("_hits"), F.lit(0)) / F.lit(period_cycles) * F.lit(sizes.stream_bytes)
    return joined.where(m_cache >= F.lit(switch_factor) * m_disk).select(*spec.stream_keys)


def without_keys(cache: DataFrame, keys: DataFrame, spec: JoinSpec) -> DataFrame:
    """Cache rows whose join value is not among ``keys`` (stream-side key names)."""
    renamed = keys.select(*spec.stream_keys_as_master())
    return cache.join(renamed, list(spec.master_keys), "left_anti")


def cache_rows_for(keys: DataFrame, rows: DataFrame, spec: JoinSpec) -> DataFrame:
    """Complete cache entries for ``keys``: their master rows, or one empty marker row."""
    renamed = keys.select(*spec.stream_keys_as_master()).distinct()
    present = rows.join(renamed, list(spec.master_keys), "left_semi").withColumn(
        EMPTY, F.lit(False)
    )
    markers = renamed.join(
        rows.select(*spec.master_keys).distinct(), list(spec.master_keys), "left_anti"
    )
    others = [c for c in spec.master_columns if c not in spec.master_keys]
    marker_rows = markers.select(
        *[F.col(c) for c in spec.master_keys],
        *[F.lit(None).cast(rows.schema[c].dataType).alias(c) for c in others],
    ).withColumn(EMPTY, F.lit(True))
    return present.unionByName(marker_rows).select(*spec.master_columns, EMPTY)


def reload_cached_values(cache: DataFrame, master_rows: DataFrame, spec: JoinSpec) -> DataFrame:
    """The cache's tracked values with their rows read again from a master snapshot.

    The fallback of :func:`apply_master_changes` when the master's commits do not say which
    rows changed (a master overwritten or compacted without a change data feed): the same
    entries, complete for the new version, at the cost of one master read.
    """
    keys = cache.select(*spec.master_keys).distinct().select(*spec.master_keys_as_stream())
    return cache_rows_for(keys, master_rows.select(*spec.master_columns), spec)


def apply_master_changes(
    cache: DataFrame, changes: DataFrame, change_type: str, spec: JoinSpec
) -> DataFrame:
    """Bring cached rows to a newer master version using the rows changed in between.

    Removed rows (deletes, update pre-images) leave as a multiset difference; added rows
    (inserts, update post-images) of cached values join. A value left without rows keeps an
    empty marker; a value that gains rows loses its marker.
    """
    columns = list(spec.master_columns)
    tracked = cache.select(*spec.master_keys).distinct()
    rows = cache.where(~F.col(EMPTY)).select(*columns)
    removed = changes.where(F.col(change_type).isin("delete", "update_preimage")).select(*columns)
    added = (
        changes.where(F.col(change_type).isin("insert", "update_postimage"))
        .select(*columns)
        .join(tracked, list(spec.master_keys), "left_semi")
    )
    current = rows.exceptAll(removed).unionByName(added)
    keys = tracked.select(*spec.master_keys_as_stream())
    return cache_rows_for(keys, current, spec)
