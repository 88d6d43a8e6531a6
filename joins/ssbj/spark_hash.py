"""Spark's ``xxhash64`` of fixed-width values, computed over Arrow arrays in the driver.

An SSBJ step that runs in the driver routes its rows by the same key hashes a Spark step
computes (``F.xxhash64`` of the join values, seed 42): the routing's moved and split keys,
the key sketches and the bucket loads are recorded by hash, so every step must hash a value
alike wherever it runs.

Spark (``catalyst.expressions.XxHash64``, ``XXH64.hashInt`` / ``hashLong``) folds a row's
values left to right, each hashed with the previous result as its seed; a null leaves the
seed as it is. Per type:

- byte, short, int, date (days): ``hashInt(v)``; boolean: ``hashInt(1 or 0)``;
- long, timestamp (microseconds): ``hashLong(v)``;
- float: ``hashInt(floatToIntBits(v))``, double: ``hashLong(doubleToLongBits(v))``, with
  -0.0 hashed as 0 and every NaN as the canonical NaN (``floatToIntBits`` collapses them).

Other types (strings, decimals, nested values) are not here: :func:`supports` says so and
the caller hashes on Spark. The arithmetic is unsigned 64-bit numpy, which wraps as Java's
``long`` does; results are returned as signed int64, as Spark's are.

Invariant (tested against Spark for every supported type, nulls included):
``xxhash64(columns) == spark.select(F.xxhash64(*columns))`` row by row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_CANONICAL_NAN64 = np.uint64(0x7FF8000000000000)
_CANONICAL_NAN32 = np.uint32(0x7FC00000)


def supports(data_type: pa.DataType) -> bool:
    """Whether :func:`xxhash64` hashes values of ``data_type`` as Spark does."""
    return _kind(data_type) is not None


def xxhash64(columns: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    """Spark's ``xxhash64(c1, c2, ...)`` (seed 42) of each row of ``columns``."""
    if not columns:
        raise ValueError("xxhash64: expected at least one column, found none")
    rows = len(columns[0])
    seeds = np.full(rows, SEED, dtype=np.uint64)
    for column in columns:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        if len(array) != rows:
            raise ValueError(f"xxhash64: columns of {rows} and {len(array)} rows")
        kind = _kind(array.type)
        if kind is None:
            raise TypeError(f"xxhash64: {array.type} is not hashed in the driver (Spark is)")
        words = _words(array, kind)
        hashed = _hash_int(words, seeds) if kind in ("int", "float") else _hash_long(words, seeds)
        valid = (
            np.ones(rows, dtype=bool)
            if array.null_count == 0
            else np.asarray(pc.is_valid(array).to_numpy(zero_copy_only=False), dtype=bool)
        )
        seeds = np.where(valid, hashed, seeds)
    return pa.array(seeds.view(np.int64), pa.int64())


def _kind(data_type: pa.DataType) -> str | None:
    if (
        pa.types.is_int8(data_type)
        or pa.types.is_int16(data_type)
        or pa.types.is_int32(data_type)
        or pa.types.is_date32(data_type)
        or pa.types.is_boolean(data_type)
    ):
        return "int"
    if pa.types.is_int64(data_type) or (
        pa.types.is_timestamp(data_type) and data_type.unit == "us"
    ):
        return "long"
    if pa.types.is_float32(data_type):
        return "float"
    if pa.types.is_float64(data_type):
        return "double"
    return None


def _words(array: pa.Array, kind: str) -> np.ndarray:
    """The values as the unsigned words Spark hashes (nulls as zeros: masked out later)."""
    if pa.types.is_boolean(array.type):
        values = np.asarray(pc.fill_null(array, False).to_numpy(zero_copy_only=False), dtype=bool)
        return values.astype(np.uint64)
    if kind == "float":
        floats = _filled(array, np.float32)
        bits = np.where(floats == 0, np.float32(0), floats).view(np.uint32)
        bits = np.where(np.isnan(floats), _CANONICAL_NAN32, bits)
        return bits.astype(np.uint64)
    if kind == "double":
        doubles = _filled(array, np.float64)
        bits = np.where(doubles == 0, np.float64(0), doubles).view(np.uint64)
        return np.where(np.isnan(doubles), _CANONICAL_NAN64, bits)
    if kind == "int":
        # Spark widens byte, short and date to int; hashInt reads the int's 32 bits.
        ints = _filled(array.cast(pa.int32()), np.int32)
        return ints.view(np.uint32).astype(np.uint64)
    longs = _filled(array.cast(pa.int64()), np.int64)
    return longs.view(np.uint64)


def _filled(array: pa.Array, dtype: type[np.generic]) -> np.ndarray:
    filled = pc.fill_null(array, pa.scalar(0, array.type)) if array.null_count else array
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=dtype)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _hash_int(words: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = seeds + _P5 + np.uint64(4)
        h = h ^ (words * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        return _fmix(h)


def _hash_long(words: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        h = seeds + _P5 + np.uint64(8)
        h = h ^ (_rotl(words * _P2, 31) * _P1)
        h = _rotl(h, 27) * _P1 + _P4
        return _fmix(h)
