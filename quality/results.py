"""What a suite validation found, independent of Great Expectations' own result classes.

The audit decides publish / quarantine from :class:`SuiteOutcome`, error messages name the
failed expectations with their counts, and :func:`result_rows` flattens outcomes into the
rows of the ``_quality/results`` Delta table (one row per expectation per validation).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import types as T

SAMPLE_VALUES = 3  # failing values quoted in a failure's description
SAMPLE_CHARS = 80  # per value (a SQL expectation's sample is a whole row)

RESULTS_SCHEMA = T.StructType(
    [
        T.StructField("run_id", T.StringType(), False),
        T.StructField("table", T.StringType(), False),
        T.StructField("suite", T.StringType(), False),
        T.StructField("batch_from_version", T.LongType(), False),
        T.StructField("batch_to_version", T.LongType(), False),
        T.StructField("expectation", T.StringType(), False),
        T.StructField("column", T.StringType(), True),
        T.StructField("description", T.StringType(), True),
        T.StructField("success", T.BooleanType(), False),
        T.StructField("observed_value", T.StringType(), True),
        T.StructField("unexpected_count", T.LongType(), True),
        T.StructField("element_count", T.LongType(), True),
        T.StructField("action", T.StringType(), False),
        T.StructField("validated_at", T.TimestampType(), False),
    ]
)


@dataclass(frozen=True)
class ExpectationOutcome:
    expectation: str
    column: str | None
    success: bool
    description: str | None = None
    observed: str | None = None
    unexpected_count: int | None = None
    element_count: int | None = None
    error: str | None = None
    unexpected_sample: tuple[str, ...] = ()
    """A few of the values (or rows, for a SQL expectation) that failed, as JSON."""

    @property
    def label(self) -> str:
        name = f"{self.expectation}({self.column})" if self.column else self.expectation
        return f"{name} [{self.description}]" if self.description else name

    def describe(self) -> str:
        if self.error:
            return f"{self.label}: raised {self.error}"
        sample = f"; e.g. {', '.join(self.unexpected_sample)}" if self.unexpected_sample else ""
        if self.unexpected_count is not None and self.element_count is not None:
            return (
                f"{self.label}: {self.unexpected_count} of {self.element_count} row(s) "
                f"failed{sample}"
            )
        if self.unexpected_count is not None:
            return f"{self.label}: {self.unexpected_count} unexpected row(s){sample}"
        return f"{self.label}: observed {self.observed}"


@dataclass(frozen=True)
class SuiteOutcome:
    suite: str
    expectations: tuple[ExpectationOutcome, ...]

    @property
    def success(self) -> bool:
        return all(e.success for e in self.expectations)

    @property
    def failures(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(e for e in self.expectations if not e.success)


def outcome_from_gx(suite: str, results: Iterable[Any]) -> SuiteOutcome:
    """Read a GX ``ExpectationSuiteValidationResult.results`` list."""
    outcomes = []
    for result in results:
        config = result.expectation_config
        kwargs = config.kwargs
        column = kwargs.get("column") or ",".join(kwargs.get("column_list") or ()) or None
        description = getattr(config, "description", None) or kwargs.get("description")
        details: Mapping[str, Any] = result.result or {}
        observed = details.get("observed_value")
        unexpected = details.get("unexpected_count")
        if unexpected is None and config.type == "unexpected_rows_expectation":
            # Its observed value is the number of rows the query returned.
            unexpected = observed
        error = _raised(result.exception_info or {})
        sampled = details.get("partial_unexpected_list")
        if sampled is None:
            sampled = (details.get("details") or {}).get("unexpected_rows")
        outcomes.append(
            ExpectationOutcome(
                expectation=config.type,
                column=column,
                success=bool(result.success),
                description=description,
                observed=None if observed is None else json.dumps(observed, default=str),
                unexpected_count=None if unexpected is None else int(unexpected),
                element_count=details.get("element_count"),
                error=error,
                unexpected_sample=_sample(sampled),
            )
        )
    return SuiteOutcome(suite, tuple(outcomes))


def _raised(info: Mapping[str, Any]) -> str | None:
    """The message of the exception an expectation raised, if any. GX reports it either at
    the top level or, when a metric failed to resolve, per metric id."""
    if info.get("raised_exception"):
        return str(info.get("exception_message"))
    for nested in info.values():
        if isinstance(nested, Mapping) and nested.get("raised_exception"):
            return str(nested.get("exception_message"))
    return None


def _sample(values: Any) -> tuple[str, ...]:
    """Up to :data:`SAMPLE_VALUES` failing values as short JSON, in GX's order."""
    if not isinstance(values, list | tuple):
        return ()
    shown = []
    for value in values[:SAMPLE_VALUES]:
        text = json.dumps(value, default=str, sort_keys=True)
        shown.append(text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 1] + "…")
    return tuple(shown)


def result_rows(
    run_id: str,
    table: str,
    outcomes: Iterable[SuiteOutcome],
    batch: tuple[int, int],
    action: str,
    validated_at: datetime,
) -> list[tuple[Any, ...]]:
    return [
        (
            run_id,
            table,
            outcome.suite,
            batch[0],
            batch[1],
            e.expectation,
            e.column,
            e.description,
            e.success,
            e.observed if e.error is None else f"error: {e.error}",
            e.unexpected_count,
            e.element_count,
            action,
            validated_at,
        )
        for outcome in outcomes
        for e in outcome.expectations
    ]
