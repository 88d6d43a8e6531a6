"""Run expectation suites through a Great Expectations Checkpoint.

One file-backed GX project per warehouse (``<root>/_quality/gx``): suites, validation
definitions and checkpoints are saved there, every run's validation results go to GX's
validation-results store, and the Data Docs site
(``gx/uncommitted/data_docs/local_site/index.html``) shows them.

Each output table is a Spark dataframe asset; the staged batch is handed over as the
``dataframe`` batch parameter, so GX validates exactly the rows that would be published.

Data Docs are rendered once per command, not once per validation: ``update_docs`` builds
the pages of the results validated since the last call, and the site index, in one pass
(the index lists every stored result, so building it per table multiplied the work). With
a :class:`~quality.docs_queue.DocsQueue` it renders only failed validations and queues
the rest for :meth:`QualityGate.render_queued` (the run report).
Each build is followed by ``quality.docs_offline.make_offline``: the pages it wrote load
their scripts and styles from copies inside the site, so they render without the internet.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql import DataFrame

from quality.batch_engine import InMemoryBatch, is_schema_expectation
from quality.docs_offline import make_offline
from quality.docs_queue import DocsQueue, QueuedPage
from quality.results import SuiteOutcome, outcome_from_gx

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.core.expectation_suite import ExpectationSuite

logger = logging.getLogger(__name__)

DATASOURCE = "pipeline"
# Batches the audit validates in the driver's memory (quality.batch_engine).
MEMORY_DATASOURCE = "pipeline_in_memory"
DEFAULT_DOCS_ASSETS = Path(__file__).resolve().parent.parent / "var" / "docs-assets"
BATCH_DEFINITION = "staged_batch"
# The suites an in-memory validation runs, named "<suite>__<part>" in GX's store and Data Docs
# (GX turns a dot of a suite name into a folder of its stores).
SCHEMA_PART = "schema"
MEMORY_PART = "in_memory"


class QualityGate:
    """A GX file context rooted at ``project_dir``; :meth:`of` keeps one per project for
    the life of the process, so a warm process (the pipeline worker) pays GX's context,
    datasource and store set-up once (0.3 s a ``validate``), not per command."""

    # The gates of the projects this process used last, newest last: a per-process cache.
    _open: ClassVar[OrderedDict[tuple[str, str], QualityGate]] = OrderedDict()
    KEPT: ClassVar[int] = 4

    @classmethod
    def of(cls, project_dir: str | Path, docs_assets: Path | None = None) -> QualityGate:
        """The process's gate of ``project_dir``: a new one when none is open, or when the
        project's files were removed since (a reset warehouse)."""
        key = (str(Path(project_dir).resolve()), str(docs_assets))
        gate = cls._open.pop(key, None)
        if gate is None or not (Path(project_dir) / "gx" / "great_expectations.yml").exists():
            gate = cls(project_dir, docs_assets)
        else:
            gate._make_current()
        cls._open[key] = gate
        while len(cls._open) > cls.KEPT:
            cls._open.popitem(last=False)
        return gate

    def __init__(self, project_dir: str | Path, docs_assets: Path | None = None) -> None:
        # No usage statistics leave this machine (and the network is closed anyway).
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        import great_expectations as gx

        self._gx = gx
        from great_expectations.data_context.types.base import ProgressBarsConfig

        self._context = gx.get_context(mode="file", project_root_dir=str(project_dir))
        if _drop_unused_config_variables(Path(project_dir) / "gx"):
            self._context = gx.get_context(mode="file", project_root_dir=str(project_dir))
        # Task logs get one line per validation from us, not a progress bar per metric.
        self._context.variables.progress_bars = ProgressBarsConfig(globally=False)
        # persist=False: GX's Spark engine would persist every batch it is handed and never
        # unpersist it, so a warm process would keep each validated batch (memory, then
        # disk) and pay its materialisation; the audit caches a batch itself when its
        # suites gain from it (quality.batch_engine.queries_views) and releases it after.
        self._datasource = self._context.data_sources.add_or_update_spark(
            name=DATASOURCE, persist=False
        )
        self._memory_datasource: Any = None  # the pandas datasource, made on first use
        # Checkpoints this process saved, by (table, suite, in memory): the suite's content
        # they were saved with, and the checkpoint.
        self._saved: dict[tuple[str, str, bool], tuple[str, Any]] = {}
        self._undocumented: list[Any] = []  # result and suite identifiers not yet rendered
        self._failed: list[Any] = []  # those of failed validations, and their suites
        self._site = Path(project_dir) / "gx" / "uncommitted" / "data_docs" / "local_site"
        self._docs_assets = docs_assets or DEFAULT_DOCS_ASSETS

    def _make_current(self) -> None:
        """GX resolves stores, suites and checkpoints through its one current project per
        process (``project_manager``, set by ``get_context``): a gate used again after
        another project's must be made current again, or it would read and write that
        project's stores."""
        from great_expectations.data_context.data_context.context_factory import (
            project_manager,
        )

        project_manager.set_project(self._context)

    def validate(
        self,
        table: str,
        suite: ExpectationSuite,
        batch: DataFrame | InMemoryBatch | pd.DataFrame,
        run_name: str,
        views: Mapping[str, DataFrame] | None = None,
    ) -> SuiteOutcome:
        """Validate ``batch`` against ``suite`` with Checkpoints; :meth:`update_docs` renders them.

        ``batch`` is a Spark DataFrame (the suite runs on GX's Spark engine; ``views`` are
        registered as Spark temp views first, for its SQL expectations to join against), or
        an :class:`InMemoryBatch` the caller collected (:mod:`quality.batch_engine` says
        when): its rows are validated by GX's pandas engine, SQL expectations by DuckDB over
        the rows and the batch's views (:mod:`quality.in_memory_sql`), and the expectations
        on Spark types against the Spark frame's schema, which reads no rows. A bare pandas
        frame is an :class:`InMemoryBatch` without views or schema.
        """
        self._make_current()
        if isinstance(batch, DataFrame):
            for name, frame in (views or {}).items():
                frame.createOrReplaceTempView(name)
            return _in_suite_order(suite, self._run(table, suite, batch, run_name))
        memory = batch if isinstance(batch, InMemoryBatch) else InMemoryBatch(batch)
        return self._validate_in_memory(table, suite, memory, run_name)

    def _validate_in_memory(
        self, table: str, suite: ExpectationSuite, batch: InMemoryBatch, run_name: str
    ) -> SuiteOutcome:
        from quality.in_memory_sql import views_for_queries

        schema_checks = [
            e.configuration for e in suite.expectations if is_schema_expectation(e.expectation_type)
        ]
        row_checks = [
            e.configuration
            for e in suite.expectations
            if not is_schema_expectation(e.expectation_type)
        ]
        found: list[Any] = []
        if schema_checks:
            if batch.schema is None:
                raise ValueError(
                    f"suite {suite.name}: expectations on Spark types need the batch's Spark "
                    "frame; an in-memory batch without one was given"
                )
            part = _part(suite, SCHEMA_PART, schema_checks)
            found += self._run(table, part, batch.schema, run_name)
        if row_checks:
            with views_for_queries(batch.views):
                found += self._run(
                    table, _part(suite, MEMORY_PART, row_checks), batch.rows, run_name
                )
        return _in_suite_order(suite, found)

    def _run(
        self, table: str, suite: ExpectationSuite, batch: DataFrame | pd.DataFrame, run_name: str
    ) -> list[Any]:
        """One Checkpoint run of ``suite`` over ``batch``: GX's expectation results."""
        from great_expectations.core.run_identifier import RunIdentifier
        from great_expectations.data_context.types.resource_identifiers import (
            ExpectationSuiteIdentifier,
        )
        from great_expectations.exceptions.resource_freshness import (
            ResourceFreshnessAggregateError,
        )

        in_memory = not isinstance(batch, DataFrame)
        checkpoint = self._checkpoint(table, suite, in_memory)
        logger.info("validating %s against suite %s (run %s)", table, suite.name, run_name)
        run_id = RunIdentifier(run_name=run_name, run_time=datetime.now(UTC))
        try:
            result = checkpoint.run(batch_parameters={"dataframe": batch}, run_id=run_id)
        except ResourceFreshnessAggregateError:
            # The project's stores changed under this process (another writer saved the
            # suite or the checkpoint): save this process's again, then run.
            self._saved.clear()
            checkpoint = self._checkpoint(table, suite, in_memory)
            result = checkpoint.run(batch_parameters={"dataframe": batch}, run_id=run_id)
        suite_page = ExpectationSuiteIdentifier(name=suite.name)
        self._undocumented.extend(result.run_results)
        if suite_page not in self._undocumented:
            self._undocumented.append(suite_page)
        failed = [key for key, run in result.run_results.items() if not run.success]
        self._failed.extend([*failed, suite_page] if failed else [])
        return [r for validation in result.run_results.values() for r in validation.results]

    def _checkpoint(self, table: str, suite: ExpectationSuite, in_memory: bool) -> Any:
        """The saved checkpoint validating ``table`` against ``suite``: saved (suite,
        validation definition, checkpoint: about 1 s of store writes) only when this process
        has not saved the same suite for the table on the same engine before."""
        key = (table, suite.name, in_memory)
        content = json.dumps(_suite_content(suite), sort_keys=True, default=str)
        saved = self._saved.get(key)
        if saved is not None and saved[0] == content:
            return saved[1]
        batch_definition = self._batch_definition(table, in_memory=in_memory)
        saved_suite = self._context.suites.add_or_update(suite)
        # Each engine validates suites of its own names (the in-memory path's are
        # "<suite>__<part>"), so a table alternating engines saves over nothing.
        name = f"{table}:{suite.name}"
        definition = self._context.validation_definitions.add_or_update(
            self._gx.ValidationDefinition(name=name, data=batch_definition, suite=saved_suite)
        )
        checkpoint = self._context.checkpoints.add_or_update(
            self._gx.Checkpoint(
                name=name,
                validation_definitions=[definition],
                actions=[],
                result_format={"result_format": "SUMMARY"},
            )
        )
        self._saved[key] = (content, checkpoint)
        return checkpoint

    def update_docs(self, queue: DocsQueue | None = None) -> None:
        """Render the results validated since the last call, and the index, into Data Docs.

        With ``queue``, only failed validations (and their suites) are rendered now; the
        other pages are queued for :meth:`render_queued` (``quality.docs_queue``).
        """
        if not self._undocumented:
            return
        now = list(self._undocumented)
        if queue is not None:
            now = list(dict.fromkeys(self._failed))
            queue.add(_queued(key) for key in self._undocumented if key not in now)
        self._undocumented.clear()
        self._failed.clear()
        if now:
            self._render(now)

    def render_queued(self, queue: DocsQueue) -> int:
        """Render every page ``queue`` holds, then drop them from it; how many."""
        pages = queue.pending()
        if pages:
            self._render([_identifier(page) for page in pages])
            queue.remove(pages)
        return len(pages)

    def _render(self, identifiers: list[Any]) -> None:
        self._make_current()
        started = time.time()
        self._context.build_data_docs(resource_identifiers=identifiers)
        make_offline(self._site, self._docs_assets, since=started)

    def _batch_definition(self, table: str, in_memory: bool = False) -> Any:
        datasource = self._datasource
        if in_memory:
            if self._memory_datasource is None:
                self._memory_datasource = self._context.data_sources.add_or_update_pandas(
                    name=MEMORY_DATASOURCE
                )
            datasource = self._memory_datasource
        try:
            asset = datasource.get_asset(table)
        except LookupError:
            asset = datasource.add_dataframe_asset(name=table)
        try:
            return asset.get_batch_definition(BATCH_DEFINITION)
        except KeyError:
            return asset.add_batch_definition_whole_dataframe(BATCH_DEFINITION)


def _part(suite: ExpectationSuite, part: str, configurations: list[Any]) -> ExpectationSuite:
    """The suite ``<suite>__<part>`` of ``configurations``, one engine's share of ``suite``."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    return ExpectationSuite(
        name=f"{suite.name}__{part}",
        expectations=[c.to_json_dict() for c in configurations],
        meta=suite.meta,
    )


def _in_suite_order(suite: ExpectationSuite, results: list[Any]) -> SuiteOutcome:
    """The outcome of ``suite`` from GX's ``results`` of its expectations, in the suite's
    order: GX orders a run's results its own way, and an in-memory validation merges two
    runs; outcomes and error messages read as the suite file does either way."""
    found = list(results)
    ordered = [_take_result(found, e.configuration) for e in suite.expectations]
    return outcome_from_gx(suite.name, ordered)


def _take_result(results: list[Any], configuration: Any) -> Any:
    """Remove and return the first of ``results`` that checked ``configuration``: the same
    type and every argument the suite gave (GX adds its own, such as ``batch_id``)."""
    for index, result in enumerate(results):
        checked = result.expectation_config
        if checked.type == configuration.type and all(
            checked.kwargs.get(key) == value for key, value in configuration.kwargs.items()
        ):
            return results.pop(index)
    raise LookupError(f"GX returned no result for {configuration.type} {configuration.kwargs}")


def _suite_content(suite: ExpectationSuite) -> dict[str, Any]:
    """What a suite checks: its name, meta and expectations, without the ids a save assigns."""
    return {
        "name": suite.name,
        "meta": suite.meta,
        "expectations": [
            {"type": c.type, "kwargs": c.kwargs, "meta": c.meta}
            for c in (e.configuration for e in suite.expectations)
        ],
    }


def _queued(identifier: Any) -> QueuedPage:
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
    )

    if isinstance(identifier, ExpectationSuiteIdentifier):
        return QueuedPage("suite", (identifier.name,))
    return QueuedPage("result", tuple(str(part) for part in identifier.to_tuple()))


def _identifier(page: QueuedPage) -> Any:
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    if page.kind == "suite":
        return ExpectationSuiteIdentifier(name=page.key[0])
    return ValidationResultIdentifier.from_tuple(page.key)


# The line of great_expectations.yml that names the project's config variables file.
_CONFIG_VARIABLES_LINE = re.compile(
    r"^config_variables_file_path:[ \t]*(?P<path>\S[^\n#]*?)[ \t]*$", re.MULTILINE
)


def _drop_unused_config_variables(project: Path) -> bool:
    """Unset the project's ``config_variables_file_path`` when the file it names defines
    nothing but GX's ``instance_id``; True when the project file was changed.

    GX re-reads and parses that YAML file on every access to a context variable, 132
    times a demo ``validate`` (0.38 s of its 2.4 s in GX, profiled). The pipeline's
    project defines its datasources in code and substitutes no variables, so GX's scaffold
    of the file is dropped (its ``instance_id`` only names the project to GX's analytics,
    which are off); a file a user filled with variables, a path given by an environment
    variable, or a project file this process cannot rewrite is left as it is. The project
    file is replaced atomically (another process may be opening it).
    """
    config = project / "great_expectations.yml"
    try:
        text = config.read_text(encoding="utf-8")
    except FileNotFoundError:
        return False
    found = _CONFIG_VARIABLES_LINE.search(text)
    if found is None:
        return False
    named = found.group("path").strip("'\"")
    if "$" in named:
        return False  # substituted from the environment: not ours to judge
    variables = Path(named) if Path(named).is_absolute() else project / named
    if variables.exists():
        import yaml

        try:
            defined = yaml.safe_load(variables.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, OSError):
            return False  # not ours to judge: GX reports it as it always did
        if not isinstance(defined, dict) or set(defined) - {"instance_id"}:
            return False
    changed = text[: found.start()] + "config_variables_file_path:" + text[found.end() :]
    staging = config.with_name(f".{config.name}.{os.getpid()}.tmp")
    try:
        staging.write_text(changed, encoding="utf-8")
        os.replace(staging, config)
    except OSError as e:
        staging.unlink(missing_ok=True)
        logger.debug("GX project %s: config variables kept (%s)", project, e)
        return False
    logger.debug("GX project %s: no config variables defined; GX will not re-read them", project)
    return True
