"""Data Docs pages queued by ``validate`` and rendered by the run report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from quality.docs_queue import DocsQueue, QueuedPage
from quality.gate import QualityGate

A = QueuedPage("result", ("suite_a", "run1", "20240101T000000Z", "batch"))
B = QueuedPage("suite", ("suite_a",))
C = QueuedPage("result", ("suite_a", "run2", "20240101T010000Z", "batch"))


def test_a_render_removes_only_what_it_rendered(tmp_path: Path) -> None:
    queue = DocsQueue(tmp_path)
    assert queue.pending() == []
    queue.add([A, B])
    queue.add([A])  # queued twice, rendered once
    rendering = queue.pending()
    assert rendering == [A, B]
    queue.add([C])  # queued while the render runs: stays for the next one
    queue.remove(rendering)
    assert queue.pending() == [C]
    queue.remove([C])
    assert queue.pending() == []


def pages(site: Path, run: str) -> list[Path]:
    return list((site / "validations").rglob(f"*{run}*/**/*.html"))


def test_validate_renders_failures_now_and_queues_the_rest(tmp_path: Path) -> None:
    from great_expectations.core.expectation_suite import ExpectationSuite

    project = tmp_path / "gx"
    gate = QualityGate(project)
    queue = DocsQueue(project)
    site = project / "gx" / "uncommitted" / "data_docs" / "local_site"
    suite = ExpectationSuite(
        name="prices",
        expectations=[
            {
                "type": "expect_column_values_to_be_between",
                "kwargs": {"column": "price", "min_value": 0, "max_value": 100},
            }
        ],
    )
    passing = gate.validate("t", suite, pd.DataFrame({"price": [1.0, 2.0]}), "good-run")
    gate.update_docs(queue)
    assert all(e.success for e in passing.expectations)
    assert pages(site, "good-run") == []
    assert {p.kind for p in queue.pending()} == {"result", "suite"}

    failing = gate.validate("t", suite, pd.DataFrame({"price": [1.0, 500.0]}), "bad-run")
    gate.update_docs(queue)
    assert not all(e.success for e in failing.expectations)
    assert len(pages(site, "bad-run")) == 1  # an operator needs this page now
    assert pages(site, "good-run") == []

    assert gate.render_queued(queue) == 2
    assert len(pages(site, "good-run")) == 1
    assert queue.pending() == []
    assert gate.render_queued(queue) == 0
