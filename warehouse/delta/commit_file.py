"""One version's commit file of a Delta log, parsed once.

A commit file (``_delta_log/<version>.json``) holds one JSON action per line (Delta
protocol, "Delta Log Entries"). Readers that follow a table ask several things of the same
version, step after step: the rows its data files add (admission looks 256 versions ahead
every step), whether its adds and removes change data, its ``commitInfo`` (which operation
wrote it), and its actions to replay a snapshot. Parsing the file once and keeping the
result per version (``warehouse.delta.version_cache``: a version never changes while its
commit file is the same file) turns these into look-ups.

Invariant: a :class:`CommitFile` holds exactly the actions of its text, in order, and every
answer below is computed from them alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class CommitFile:
    """The actions of one commit file, in the file's order."""

    version: int
    actions: tuple[Mapping[str, Any], ...]

    @classmethod
    def parse(cls, version: int, text: str) -> CommitFile:
        """The actions of ``text`` (blank lines skipped); a line that is not JSON raises
        ``ValueError``."""
        return cls(version, tuple(json.loads(line) for line in text.splitlines() if line.strip()))

    @cached_property
    def rows_added(self) -> int:
        """Rows of the data files the commit adds with ``dataChange`` (missing means true),
        from each add's ``numRecords``; an add without statistics counts none."""
        rows = 0
        for action in self.actions:
            add = action.get("add")
            if add and add.get("dataChange", True) and add.get("stats"):
                rows += int(json.loads(add["stats"]).get("numRecords", 0))
        return rows

    @cached_property
    def info(self) -> Mapping[str, Any]:
        """The ``commitInfo`` action's body (empty when the commit has none)."""
        for action in self.actions:
            body = action.get("commitInfo")
            if isinstance(body, Mapping):
                return body
        return {}

    @cached_property
    def quiet_paths(self) -> frozenset[str]:
        """The log paths the commit adds or removes with ``dataChange=false`` (a
        compaction's files)."""
        quiet = set()
        for action in self.actions:
            body = action.get("add") or action.get("remove")
            if body and body.get("dataChange") is False:
                quiet.add(str(body["path"]))
        return frozenset(quiet)
