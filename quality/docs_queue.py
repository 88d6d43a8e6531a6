"""Data Docs pages still to be rendered: the results ``validate`` left to the report.

Rendering a Data Docs build costs about 0.9 s of every ``validate`` however few pages it
renders (GX compiles its page templates again on each build; profile in BENCHMARKS.md),
more than the validation itself for a small batch. So, with ``data_docs: report`` (the
default), ``validate`` renders at once only the pages of failed validations, which an
operator needs to decide on the quarantined batch, and queues the others here; the run
report (``enrich report``, run by the quality-report DAG that every publish triggers)
renders the queue before it links the pages.

The queue is a JSON-lines file in the GX project. Invariants: an append and a removal
each hold an exclusive lock on the file; the renderer removes exactly the pages it
rendered, so a page queued while a render runs stays queued for the next one; a page
queued twice is rendered once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

QUEUE_FILE = "docs-queue.jsonl"


@dataclass(frozen=True)
class QueuedPage:
    """One page: a validation result's (its GX identifier as a tuple) or a suite's."""

    kind: Literal["result", "suite"]
    key: tuple[str, ...]


class DocsQueue:
    """The queue of one GX project (``<project>/docs-queue.jsonl``)."""

    def __init__(self, project_dir: str | Path) -> None:
        self.path = Path(project_dir) / QUEUE_FILE

    def add(self, pages: Iterable[QueuedPage]) -> None:
        lines = [json.dumps({"kind": p.kind, "key": list(p.key)}) + "\n" for p in pages]
        if not lines:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked("a") as handle:
            handle.writelines(lines)

    def pending(self) -> list[QueuedPage]:
        """The queued pages, each once, in the order they were first queued."""
        if not self.path.exists():
            return []
        with self._locked("r") as handle:
            return _unique(_parse(handle.read()))

    def remove(self, pages: Iterable[QueuedPage]) -> None:
        done = set(pages)
        if not done or not self.path.exists():
            return
        with self._locked("r+") as handle:
            left = [p for p in _unique(_parse(handle.read())) if p not in done]
            handle.seek(0)
            handle.truncate()
            handle.writelines(json.dumps({"kind": p.kind, "key": list(p.key)}) + "\n" for p in left)

    @contextlib.contextmanager
    def _locked(self, mode: str) -> Iterator[IO[str]]:
        with self.path.open(mode) as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield handle
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _parse(text: str) -> list[QueuedPage]:
    pages = []
    for line in text.splitlines():
        if line.strip():
            entry = json.loads(line)
            pages.append(QueuedPage(entry["kind"], tuple(str(k) for k in entry["key"])))
    return pages


def _unique(pages: Iterable[QueuedPage]) -> list[QueuedPage]:
    return list(dict.fromkeys(pages))
