"""Which files hold the rows added to a Delta table over a range of versions, compactions
included.

A reader that follows a table by the rows added in ``(after, to]`` (a stage's input, an
audit's batch) replays the range's commits. Only ``dataChange=true`` actions move rows
(Delta protocol, "Add File and Remove File"): a compaction removes files and adds files with
``dataChange=false``, and its new files hold the same rows. The rows added in the range are
therefore read from the files that added them, even after a compaction removed those files
from the snapshot (they stay on disk until a vacuum; ``enrich maintain`` keeps them for the
followers).

Invariant kept by :class:`AddedFiles` after any sequence of commits: :meth:`AddedFiles.files`
holds exactly the files added with ``dataChange=true`` in the range whose rows are all still
live, each with the version that added it and its latest description (the native engine's
Add action with the deletion vector in force). A file's rows stop being live when a
``dataChange=true`` remove drops the file, or drops every output of the compaction that
rewrote it (a compaction works within one partition, so its outputs in that partition hold
exactly the rows of the files it removed there). A data change to only some of those
outputs would delete an unknown part of the added rows: :class:`PartialRewriteError`,
never a guess.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from common.errors import DeltaTableError

Payload = TypeVar("Payload")


class PartialRewriteError(DeltaTableError):
    """A data change touched some, not all, of the files a compaction wrote."""


@dataclass(frozen=True)
class FileAction(Generic[Payload]):
    """One add or remove of a commit: the file's location, its partition (any hashable
    form of the partition values), whether it changes data, and what the engine needs to
    read the file (ignored for removes)."""

    path: str
    partition: Hashable
    data_change: bool
    payload: Payload | None = None


@dataclass(frozen=True)
class AddedFile(Generic[Payload]):
    """A file whose rows were added in the range and are all still live."""

    path: str
    version: int
    payload: Payload


@dataclass
class _Rewrite:
    """The outputs of one compaction group (one commit, one partition) still live, and the
    added files whose rows they hold."""

    outputs: set[str]
    sources: set[str]


@dataclass
class AddedFiles(Generic[Payload]):
    """Replays commits in version order; :meth:`files` answers at any point."""

    table: str
    _added: dict[str, AddedFile[Payload]] = field(default_factory=dict)
    _rewrite_of: dict[str, _Rewrite] = field(default_factory=dict)

    def commit(
        self,
        version: int,
        adds: Sequence[FileAction[Payload]],
        removes: Sequence[FileAction[Payload]],
    ) -> None:
        """Apply one commit's actions."""
        removed = {r.path for r in removes if r.data_change}
        # An add of a path the same commit removes is that file with a new deletion vector
        # (the native engine's DELETE/UPDATE): its rows were added when the file was.
        updated = {a.path for a in adds if a.data_change and a.path in removed}
        self._drop(version, removed, updated)
        for add in adds:
            if not add.data_change:
                continue
            known = self._added.get(add.path)
            if add.path in updated:
                if known is not None:
                    self._added[add.path] = AddedFile(add.path, known.version, _payload(add))
                continue
            self._added[add.path] = AddedFile(add.path, version, _payload(add))
        self._rewrite(
            [a for a in adds if not a.data_change], [r for r in removes if not r.data_change]
        )

    def files(self) -> list[AddedFile[Payload]]:
        """The files added in the range whose rows are all still live, by version then path."""
        return sorted(self._added.values(), key=lambda f: (f.version, f.path))

    def _drop(self, version: int, removed: set[str], updated: set[str]) -> None:
        """A commit's data removes: of added files directly, of compaction outputs through
        their group (all outputs at once, or the error)."""
        touched: dict[int, _Rewrite] = {}
        for path in removed:
            if path in self._added:
                if path not in updated:
                    del self._added[path]
                continue
            rewrite = self._rewrite_of.get(path)
            if rewrite is not None:
                touched[id(rewrite)] = rewrite
        for rewrite in touched.values():
            gone = rewrite.outputs & removed
            rewrite.outputs -= gone
            for path in gone:
                del self._rewrite_of[path]
            if not rewrite.sources:
                continue  # a rewrite of files from before the range only
            if rewrite.outputs or gone & updated:
                raise PartialRewriteError(
                    f"table {self.table}: version {version} changed {len(gone)} of the "
                    f"{len(gone) + len(rewrite.outputs)} file(s) a compaction wrote from "
                    f"files added in the range, so which added rows are gone cannot be told. "
                    f"Read the range before compacting, or enable the change data feed."
                )
            for source in rewrite.sources:
                self._added.pop(source, None)

    def _rewrite(
        self, adds: Sequence[FileAction[Payload]], removes: Sequence[FileAction[Payload]]
    ) -> None:
        """A compaction: per partition, its new files and the files of any earlier rewrite it
        left in place together hold the rows of the files it removed."""
        partitions = {a.partition for a in adds} | {r.partition for r in removes}
        for partition in partitions:
            merged = _Rewrite({a.path for a in adds if a.partition == partition}, set())
            gone = {r.path for r in removes if r.partition == partition}
            for removed in gone:
                if removed in self._added:
                    merged.sources.add(removed)
                earlier = self._rewrite_of.pop(removed, None)
                if earlier is not None:
                    earlier.outputs.discard(removed)
                    merged.outputs |= earlier.outputs
                    merged.sources |= earlier.sources
            # An earlier rewrite's outputs join before its other outputs this commit removes
            # are seen: none of this commit's removes may stay an output of the merged group.
            merged.outputs -= gone
            for output in merged.outputs:
                self._rewrite_of[output] = merged


def live_files_by_version(
    table: str,
    commits: Iterable[tuple[int, Sequence[FileAction[Payload]], Sequence[FileAction[Payload]]]],
    skip_versions: Iterable[int] = (),
) -> dict[int, list[Payload]]:
    """Replay ``commits`` ((version, adds, removes), in version order): the payloads of the
    files whose rows are still live, by the version that added them, in version order and
    without the files ``skip_versions`` added. What ``rows_added`` reads, in either engine.
    """
    skip = set(skip_versions)
    tracker: AddedFiles[Payload] = AddedFiles(table)
    for version, adds, removes in commits:
        tracker.commit(version, adds, removes)
    by_version: dict[int, list[Payload]] = {}
    for added in tracker.files():
        if added.version not in skip:
            by_version.setdefault(added.version, []).append(added.payload)
    return dict(sorted(by_version.items()))


def _payload(add: FileAction[Payload]) -> Payload:
    if add.payload is None:
        raise ValueError(f"add of {add.path} carries no payload")
    return add.payload
