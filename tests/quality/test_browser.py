"""End to end in real headless Chromium: the run report's plots and the failing expectation.

Debian's ``chromium`` is installed by ``make test`` (target ``browser-deps``) and driven by
Playwright. Every request that is not a ``file://`` URL is aborted and recorded, with no
substitute served: the report and the Data Docs must render from the files on disk alone
(Data Docs load copies of their scripts from inside the site, quality/docs_offline.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from pyspark.sql import SparkSession

from common.errors import EXIT_OK, EXIT_VALIDATION, ValidationFailedError
from jobs.enrich import main
from pipeline.run_report import write_run_report
from reports.html_report import PLOT_IDS
from tests.conftest import REPO_ROOT
from tests.pipeline.audit_harness import quarantined_second_batch, validate

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO_ROOT / "var" / "screenshots"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def failed_run(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, base: Path) -> Path:
    """A pipeline with one published batch and one quarantined (out-of-range price).

    Its config is saved beside the report as ``pipeline.yaml``, for the CLI.
    """
    root = tmp_path_factory.mktemp("browser")
    h = quarantined_second_batch(spark, base, root)
    with pytest.raises(ValidationFailedError):
        validate(h, "r2")
    (root / "pipeline.yaml").write_text(yaml.safe_dump(h.config.model_dump(mode="json")))
    report = write_run_report(h.context, None, None, root / "report.html")
    assert report.runs == 2 and [u["run_id"] for u in report.unresolved] == ["r2"]
    return report.path


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.exists(), "Debian chromium is missing: `make test` installs it"
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield instance
        instance.close()


def open_page(browser: object, blocked: list[str]) -> object:
    """A page that may load ``file://`` URLs only; every other request is aborted and
    recorded in ``blocked`` (the machine is offline, and so must the pages be)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]

    def route(route: object) -> None:
        url = route.request.url  # type: ignore[attr-defined]
        if url.startswith("file://"):
            route.continue_()  # type: ignore[attr-defined]
        else:
            blocked.append(url)
            route.abort()  # type: ignore[attr-defined]

    context.route("**/*", route)
    return context.new_page()


def test_run_report_shows_every_plot_and_the_failure(browser: object, failed_run: Path) -> None:
    blocked: list[str] = []
    page = open_page(browser, blocked)
    page.goto(failed_run.as_uri())  # type: ignore[attr-defined]
    for plot_id in PLOT_IDS:
        svg = page.locator(f"section#{plot_id} svg")  # type: ignore[attr-defined]
        assert svg.count() == 1, plot_id
        assert svg.is_visible(), plot_id
        box = svg.bounding_box()
        assert box["width"] > 300 and box["height"] > 100, (plot_id, box)
        # Data marks: line paths or bar patches beyond the axes.
        assert svg.locator("path").count() > 5, plot_id
    unresolved = page.locator("table#unresolved")  # type: ignore[attr-defined]
    assert unresolved.is_visible()
    assert "r2" in unresolved.inner_text()
    assert "be_between(price)" in unresolved.inner_text()
    # Each output's intervals, with what r1's validate published of them.
    completeness = page.locator("table#completeness")  # type: ignore[attr-defined]
    assert completeness.is_visible()
    assert "out" in completeness.inner_text() and "%" in completeness.inner_text()
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "run-report.png"), full_page=True)  # type: ignore[attr-defined]
    assert blocked == []


def test_data_docs_render_offline_with_the_failing_expectation(
    browser: object, failed_run: Path
) -> None:
    blocked: list[str] = []
    page = open_page(browser, blocked)
    page.goto(failed_run.as_uri())  # type: ignore[attr-defined]
    page.click("#data-docs")  # type: ignore[attr-defined]
    page.wait_for_load_state("load")  # type: ignore[attr-defined]
    assert page.url.endswith("data_docs/local_site/index.html")  # type: ignore[attr-defined]
    rows = page.locator("table.ge-index-page-validation-results-table tbody tr")  # type: ignore[attr-defined]
    rows.first.wait_for(state="visible", timeout=15_000)
    assert rows.filter(has_text="r1").count() >= 1  # the index lists every run validated
    # The batch was small, so validated in memory: the suite's type checks against its
    # Spark schema ("out_suite__schema", passed) and the rest ("out_suite__in_memory").
    failed_row = rows.filter(has_text="r2").filter(has_text="out_suite__in_memory")
    assert failed_row.count() == 1
    assert failed_row.locator(".ge-failed-icon, .fa-times").count() >= 1
    schema_row = rows.filter(has_text="r2").filter(has_text="out_suite__schema")
    assert schema_row.count() == 1
    assert schema_row.locator(".ge-failed-icon, .fa-times").count() == 0
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "data-docs-index.png"), full_page=True)  # type: ignore[attr-defined]

    failed_row.click()
    page.wait_for_load_state("load")  # type: ignore[attr-defined]
    assert "/validations/out_suite__in_memory/r2/" in page.url  # type: ignore[attr-defined]
    failing = page.locator("tr", has_text="values must be greater than or equal to")  # type: ignore[attr-defined]
    assert failing.count() == 1
    assert failing.locator(".fa-times").is_visible()
    assert re.search(r"\d+ unexpected values? found", failing.inner_text())
    assert page.locator("text=Status:").first.is_visible()  # type: ignore[attr-defined]
    page.screenshot(path=str(SCREENSHOTS / "data-docs-failed-validation.png"), full_page=True)  # type: ignore[attr-defined]
    # Every script and style came from the site itself: nothing was asked of the network.
    assert blocked == []


def test_report_cli_fails_on_unresolved_batches_until_resolved(failed_run: Path) -> None:
    config = str(failed_run.parent / "pipeline.yaml")
    out = str(failed_run.parent / "cli-report.html")
    report = ["--config", config, "report", "--fail-on-unresolved", "--out", out]
    assert main(report) == EXIT_VALIDATION
    assert main(["--config", config, "resolve", "out", "--run-id", "nope"]) != EXIT_OK
    assert main(["--config", config, "resolve", "out", "--run-id", "r2"]) == EXIT_OK
    assert main(report) == EXIT_OK
    assert "table#unresolved" not in Path(out).read_text()
