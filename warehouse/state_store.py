"""The pipeline state store: small control data in any SQLAlchemy database.

It holds the run ledger, the landing-file ledger, stage offsets (last consumed version of
each input table), the join operators' controller state, per-run metrics, the Delta
versions that in-flight work still pins and each output's completeness per event-time
interval. Bulk operator state (cache rows, pending tuples) lives in Delta tables under the
warehouse root, never here.

SQLite is the embedded default; a deployment passes a PostgreSQL URL
(``postgresql+psycopg://user:password@host/db``; psycopg is a dependency). Both backends
behave the same (:mod:`warehouse.state_sessions`); the schema is created or migrated on
first use (:mod:`warehouse.state_schema`). :class:`StateStore` is the one object callers
hold; each concern's methods live in a module of their own, over the tables of
:mod:`warehouse.state_tables`.
"""

from __future__ import annotations

from warehouse.state_completeness import Completeness
from warehouse.state_landing import LandingLedger
from warehouse.state_metrics import Metrics
from warehouse.state_pins import VersionPins
from warehouse.state_progress import StageProgress
from warehouse.state_runs import RunLedger


class StateStore(RunLedger, LandingLedger, StageProgress, Metrics, Completeness, VersionPins):
    """Typed access to the control tables; every method is one short transaction."""
