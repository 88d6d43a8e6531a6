"""The Delta versions each part of the pipeline pins, so ``enrich maintain`` keeps their files.

A holder pins the versions it will still read by time travel; ``StateStore.set_pins``
replaces all of a holder's pins at once, and ``enrich maintain`` passes every version pinned
on a table, by any holder, to ``vacuum`` as ``keep_versions``. Holders:

``ssbj.<stage>``   the consumed input version, the master versions pending tuples are pinned
                   to, the master versions of the cache and the switching buffer; while a
                   step's plan is open also the plan's master version, the master versions
                   whose changes it reads, the operator-table versions and the input
                   versions it reads
``stage.<stage>``  the consumed input version; from a baseline or theta step's plan until
                   the step is done also its planned master version and input versions
``late.<stage>``   the late table version a step of a stage with ``operator.late_master``
                   reads, and after the step the version it wrote (``pipeline.waiting_tuples``)
``adsp.<stage>``   the master version an A-DSP stage's persisted layout was built from, and
                   the layout version the state records
``audit.<table>``  the last audited output (silver) version and the pending-table version
                   the audit state records
``completeness.<table>``  the root stream's bronze version whose rows the table's
                   completeness record has counted (``pipeline.completeness``)

A stage follows its input by the rows added after the version it consumed
(:meth:`warehouse.delta.engine.DeltaEngine.rows_added`), which reads files a compaction may
have removed since; so the consumed version stays pinned between steps, and ``enrich
maintain`` keeps every file removed after the oldest pinned version of a followed table.

Table paths are normalised with :func:`table_key` on both sides (pinning and vacuuming).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any

from pipeline.layout import WarehouseLayout


def table_key(path: str) -> str:
    """The one spelling of a table path under which it is pinned and looked up."""
    return path if "://" in path else os.path.abspath(path)


class PinHolder(StrEnum):
    """The kinds of holder above: ``PinHolder.SSBJ.of("orders_customer")`` is the holder
    ``ssbj.orders_customer``."""

    SSBJ = "ssbj"
    STAGE = "stage"
    LATE = "late"
    ADSP = "adsp"
    AUDIT = "audit"
    COMPLETENESS = "completeness"

    def of(self, name: str) -> str:
        return f"{self.value}.{name}"


def union_pins(*pins: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
    """All versions any of ``pins`` holds, per table key, sorted; tables without any dropped."""
    merged: dict[str, set[int]] = {}
    for mapping in pins:
        for path, versions in mapping.items():
            merged.setdefault(table_key(path), set()).update(int(v) for v in versions)
    return {path: sorted(versions) for path, versions in sorted(merged.items()) if versions}


def input_versions(after_version: int, to_version: int) -> range:
    """The versions ``rows_added(after_version, to_version)`` reads the added files of."""
    return range(after_version + 1, to_version + 1)


def audit_pins(
    layout: WarehouseLayout, table: str, state: Mapping[str, Any]
) -> dict[str, list[int]]:
    """The pins of ``audit.<table>`` for the audit state ``state`` of output ``table``.

    ``state`` is the audit state as ``AuditPublisher`` saves it. The next audit reads the
    staged rows after ``output_version``, and the pending tuples at ``pending_version`` of
    ``pending_table`` (the table the stage's driver keeps them in) by time travel. While an
    ``intent`` is open (decided, not yet recorded), finishing it re-reads the silver batch
    at ``intent.batch[1]`` and records ``intent.record``'s pending version: those are pinned
    too.
    """
    silver = layout.staged(table)
    pins: dict[str, list[int]] = {silver: []}

    def pin_pending(record: Mapping[str, Any]) -> None:
        version, path = record.get("pending_version"), record.get("pending_table")
        if version is not None and path is not None:
            pins.setdefault(path, []).append(int(version))

    if state.get("output_version") is not None:
        pins[silver].append(int(state["output_version"]))
    pin_pending(state)
    intent = state.get("intent") or {}
    if intent.get("batch"):
        pins[silver].append(int(intent["batch"][1]))
    pin_pending(intent.get("record") or {})
    return union_pins(pins)
