"""File layout conventions: Hive partition directories and path normalisation.

Spark writes partitioned Parquet as ``col=value`` directories with Hive escaping (``%XX``)
and ``__HIVE_DEFAULT_PARTITION__`` for null. Spark renders dates as ``YYYY-MM-DD`` and, in
the UTC session this product forces, timestamps as ``YYYY-MM-DD HH:MM:SS[.ffffff]``, which
is exactly the Delta protocol's partition value encoding.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any
from urllib.parse import unquote

HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/*")


def partition_values_from_path(relative_dir: str) -> dict[str, str | None]:
    """Decode ``a=1/b=x%2Fy`` into ``{"a": "1", "b": "x/y"}`` (Hive unescaping)."""
    values: dict[str, str | None] = {}
    for segment in relative_dir.strip("/").split("/"):
        if not segment:
            continue
        key, sep, raw = segment.partition("=")
        if not sep:
            raise ValueError(f"expected a col=value partition directory, found {segment!r}")
        values[unquote(key)] = None if raw == HIVE_NULL else unquote(raw)
    return values


def delta_partition_literal(value: Any) -> str | None:
    """Encode a Python value the way the Delta log stores partition values."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        text = value.strftime("%Y-%m-%d %H:%M:%S")
        return f"{text}.{value.microsecond:06d}" if value.microsecond else text
    if isinstance(value, date):
        return value.isoformat()
    return str(value)


def normalised_location(uri_or_path: str) -> str:
    """A scheme-less, single-leading-slash form of a file location, for matching.

    Spark reports ``file:/a/b`` where a Python path is ``/a/b`` and delta-rs may say
    ``file:///a/b``; dropping the scheme and slashes makes the three comparable.
    """
    return "/" + _SCHEME.sub("", uri_or_path).lstrip("/")


def uri_suffix_keys(uris: Sequence[str], locations: Sequence[str]) -> tuple[int, list[str]] | None:
    """Keys that tell Spark's file URIs apart by their last path segments, per location.

    ``uris`` are the files of one read as Spark names them (``DataFrame.inputFiles()``,
    percent-encoded URIs); ``locations`` the same files as the log gives them. Returns
    ``(depth, keys)``: ``keys[i]`` is the last ``depth`` ``/``-separated segments of the
    URI of ``locations[i]``, for the smallest ``depth`` at which the keys are distinct. A
    row's ``substring_index(_metadata.file_path, '/', -depth)`` is then its file's key:
    the tail of a URI is encoded the same whichever form (``file:/`` or ``file:///``) its
    head takes, and a key costs a row no decoding. None when the URIs are not exactly the
    locations (each matched once, after decoding) or no depth tells them apart.
    """
    by_location: dict[str, str] = {}
    for uri in uris:
        decoded = normalised_location(unquote(uri))
        if decoded in by_location:
            return None
        by_location[decoded] = uri
    wanted = [normalised_location(location) for location in locations]
    if len(set(wanted)) != len(wanted) or set(wanted) != set(by_location):
        return None
    if not wanted:
        return 1, []
    ordered = [by_location[location].split("/") for location in wanted]
    # Only segments of the path itself, never the scheme's ("file:", or the empty ones of
    # "file:///"): a location "/a/b" has two.
    deepest = min(location.count("/") for location in wanted)
    for depth in range(1, deepest + 1):
        keys = ["/".join(parts[-depth:]) for parts in ordered]
        if len(set(keys)) == len(keys):
            return depth, keys
    return None
