"""The columns and roles of SSBJ's wide step table and of its state table.

A step's input is one wide table: every row carries a ``_role`` saying what it is (a new
stream tuple, a pending tuple, a cache row, a master partition row, ...) and the columns of
that role; the others are null. Stream columns are stored as ``s__<name>``, master columns
as ``r__<name>``, so the two sides never collide (``joins.ssbj.buckets``). No Spark here.
"""

from __future__ import annotations

ROLE = "_role"
BUCKET = "_bucket"
ENTRY_STEP = "_entry_step"
PINNED_VERSION = "_pinned_version"
MATCHED = "_matched"
VERSION = "_version"
EMPTY = "_empty"
CHANGE = "_change"
HITS = "_hits"
MASTER_ROWS = "_master_rows"
OBSERVED = "_observed"
METRIC = "_metric"
VALUE = "_value"
# Of a stream tuple's row, the same column: when it first met no master row (epoch µs).
LATE_SINCE = VALUE
# Columns of a step's result only (not of the state): where a bucket's load came from.
KEY_HASH = "_key_hash"
STORED = "_stored"
PROBES = "_probes"
SKETCH = "_sketch"  # a bucket's ASketch of its new tuples' key hashes, as JSON

# Input roles
NEW = "new"
PARTITION = "partition"
CACHE_CHANGE = "cache_change"
SWITCH_CHANGE = "switch_change"
RELOAD = "reload"
REMOVED, ADDED = "removed", "added"
# State roles (input and output)
PENDING = "pending"
CACHE = "cache"
COUNTER = "counter"
MARKED = "marked"
SWITCH = "switch"
# Tuples waiting for a newer master version (state), and those returning for it (input
# only): ``joins.ssbj.late``.
LATE = "late"
RETURNING = "returning"
STATE_ROLES = (PENDING, CACHE, COUNTER, MARKED, SWITCH, LATE)
# Rows of stream tuples (placed by the tuple's join value), and those that ask for the
# master rows of their value (partition rows no such row asks for can match nothing).
STREAM_ROLES = (NEW, PENDING, LATE, RETURNING)
ASKING_ROLES = (NEW, PENDING, MARKED, LATE, RETURNING)
# Output roles
OUT = "out"
METRIC_ROLE = "metric"
KEY_LOAD = "key_load"
KEY_SKETCH = "key_sketch"
LOADED_ROLES = (PENDING, CACHE)  # |R_i|: the state a bucket holds (FastJoin Eq. 3)
PROBING_ROLES = (NEW, PARTITION)  # phi_si: the rows that probe it this step (Eq. 4)


def stream_field(column: str) -> str:
    return f"s__{column}"


def master_field(column: str) -> str:
    return f"r__{column}"
