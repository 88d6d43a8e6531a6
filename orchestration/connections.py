"""The Spark master and the state store of a task's command, from Airflow connections.

In a deployment, operators keep the cluster's address and the state store's credentials
in Airflow connections (``enrich_spark``, ``enrich_state_store``: an ``AIRFLOW_CONN_*``
variable, a secrets backend or the UI), not in the pipeline's YAML. A task reads them just
before it runs its ``enrich`` command. The command line and the process environment still
win, so one setting on a worker overrides every DAG:

- Spark master: ``enrich --master``, then ``SPARK_MASTER``, then the ``enrich_spark``
  connection, then the config's ``spark.master``, then ``local[2]``;
- state store: ``ENRICH_STATE_STORE``, then the ``enrich_state_store`` connection, then the
  config's ``warehouse.state_store``, then SQLite under the warehouse.

The conversions are plain functions of the connection's fields (:class:`ConnectionFields`)
so they are tested without Airflow; only :func:`lookup` imports it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError

logger = logging.getLogger(__name__)

SPARK_CONNECTION = "enrich_spark"
STATE_STORE_CONNECTION = "enrich_state_store"
DEFAULT_SPARK_PORT = 7077


@dataclass(frozen=True)
class ConnectionFields:
    """The fields of an Airflow connection this module reads."""

    conn_id: str
    conn_type: str
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = None
    schema: str | None = None

    @classmethod
    def of(cls, connection: Any) -> ConnectionFields:
        return cls(
            conn_id=str(connection.conn_id),
            conn_type=str(connection.conn_type or ""),
            host=connection.host or None,
            port=int(connection.port) if connection.port else None,
            login=connection.login or None,
            password=connection.password or None,
            schema=connection.schema or None,
        )


def spark_master_url(connection: ConnectionFields) -> str:
    """The master URL of a ``spark`` connection, as the Apache Spark provider writes them:
    a host with or without its scheme (``spark://h``, ``h``, ``yarn``, ``local[4]``) and an
    optional port (``spark://`` defaults to 7077)."""
    host = (connection.host or "").strip().rstrip("/")
    if connection.conn_type != "spark":
        raise ConfigError(
            f"Airflow connection {connection.conn_id!r}: expected conn_type 'spark' (a Spark "
            f"master), found {connection.conn_type!r}"
        )
    if not host:
        raise ConfigError(
            f"Airflow connection {connection.conn_id!r}: expected the Spark master in its "
            "host (spark://host, yarn, local[4]), found none"
        )
    if host in ("yarn", "local") or host.startswith(("local[", "k8s://")):
        return host
    if "://" not in host:
        host = f"spark://{host}"
    scheme, _, address = host.partition("://")
    if ":" in address:  # the host already carries a port
        return host
    return f"{scheme}://{address}:{connection.port or DEFAULT_SPARK_PORT}"


def state_store_url(connection: ConnectionFields) -> str:
    """The SQLAlchemy URL of a ``postgres`` connection, with the psycopg (3) driver."""
    if connection.conn_type not in ("postgres", "postgresql"):
        raise ConfigError(
            f"Airflow connection {connection.conn_id!r}: expected conn_type 'postgres' (the "
            f"state store's PostgreSQL), found {connection.conn_type!r}"
        )
    if not connection.host or not connection.schema:
        raise ConfigError(
            f"Airflow connection {connection.conn_id!r}: expected a host and a schema (the "
            f"database), found host={connection.host!r} schema={connection.schema!r}"
        )
    from sqlalchemy.engine import URL

    url = URL.create(
        "postgresql+psycopg",
        username=connection.login,
        password=connection.password,
        host=connection.host,
        port=connection.port,
        database=connection.schema,
    )
    return url.render_as_string(hide_password=False)


def lookup(conn_id: str) -> ConnectionFields | None:
    """The connection ``conn_id`` from Airflow (environment, secrets backend, metadata
    database), or None when it is not defined."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        logger.debug("no Airflow connection %s", conn_id)
        return None
    return ConnectionFields.of(connection)
