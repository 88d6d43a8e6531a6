"""Which bucket (Spark task) each row of an SSBJ step's wide table goes to, under the
step's key routing (:mod:`joins.skew.key_routing`): a key's owner bucket, or for a split
hot key, one of its buckets for a stream tuple and all of them for the rows each replica
needs. Both lookups are SQL literals in the plan: no join, no broadcast.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from joins.skew.key_routing import KeyRouting, task_labels
from joins.ssbj.roles import (
    CACHE,
    CACHE_CHANGE,
    MARKED,
    PARTITION,
    RELOAD,
    STREAM_ROLES,
    SWITCH,
    SWITCH_CHANGE,
)


def _owner(key_hash: Column, routing: KeyRouting) -> Column:
    """The bucket that holds a key's state: moved (a literal map) or at home."""
    home = F.pmod(key_hash, F.lit(routing.buckets))
    if not routing.moved:
        return home
    hashes = ",".join(f"{h}L" for h, _ in routing.moved)
    targets = ",".join(str(b) for _, b in routing.moved)
    moved = F.expr(f"map_from_arrays(array({hashes}), array({targets}))")
    return F.coalesce(F.try_element_at(moved, key_hash), home)


def _labels(routing: KeyRouting) -> Column:
    return F.expr(f"array({','.join(str(label) for label in task_labels(routing.buckets))})")


def bucket_label(key_hash: Column, routing: KeyRouting) -> Column:
    """The group label of a key's owner bucket under ``routing``, labelled so that Spark's
    hash partitioning puts bucket ``b`` in task ``b`` (``task_labels``).

    Both lookups are SQL literals (a map of the moved keys, an array of labels): constant
    data in the plan, no join and no broadcast."""
    bucket = _owner(key_hash, routing)
    return F.element_at(_labels(routing), (bucket + 1).cast(T.IntegerType())).cast(T.IntegerType())


# Rows a replica of a split key needs beside its share of the new tuples: the key's cache
# entry and the master's changes to it (cache phase), the master partition rows (disk
# phase, for the tuples that miss the replica's copy of the cache), and s_B with its
# changes: at a phase-out step s_B becomes the cache, and a replica without the copy would
# send its share of the key's new tuples to H_S for a whole R-cycle (measured: 53% of
# tuples answered by the cache at z = 2 with splitting against 66.5% without).
REPLICATED_ROLES = (CACHE, CACHE_CHANGE, RELOAD, PARTITION, MARKED, SWITCH, SWITCH_CHANGE)


def bucket_labels(
    key_hash: Column, role: Column, tuple_hash: Column, routing: KeyRouting
) -> Column:
    """The labels of every bucket a row goes to (an array, to explode): the owner's, except
    for split keys (``KeyRouting.split``), whose stream tuples (new and pending) go to one
    of the key's buckets by ``tuple_hash`` and whose :data:`REPLICATED_ROLES` rows go to
    all of them. A pending tuple stays in its bucket while the key's buckets stay the same;
    in any bucket it meets the partition, which every bucket of the key receives."""
    owner = _owner(key_hash, routing)
    hashes = ",".join(f"{h}L" for h, _ in routing.split)
    replicas = ",".join(f"array({','.join(str(b) for b in r)})" for _, r in routing.split)
    split = F.try_element_at(
        F.expr(f"map_from_arrays(array({hashes}), array({replicas}))"), key_hash
    )
    every = F.concat(F.array(owner), split)
    pick = F.element_at(every, (F.pmod(tuple_hash, F.size(every)) + 1).cast(T.IntegerType()))
    buckets = (
        F.when(split.isNull(), F.array(owner))
        .when(role.isin(*STREAM_ROLES), F.array(pick))
        .when(role.isin(*REPLICATED_ROLES), every)
        .otherwise(F.array(owner))
    )
    labels = _labels(routing)
    return F.transform(
        buckets, lambda b: F.element_at(labels, (b + 1).cast(T.IntegerType())).cast("int")
    )
