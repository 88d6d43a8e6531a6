"""The Spark master, the state store and the object store of a task's command, from
Airflow connections.

In a deployment, operators keep the cluster's address, the state store's credentials and
the object store's endpoint and keys in Airflow connections (``enrich_spark``,
``enrich_state_store``, ``enrich_object_store``: an ``AIRFLOW_CONN_*`` variable, a secrets
backend or the UI), not in the pipeline's YAML. A task reads them just
before it runs its ``enrich`` command. The command line and the process environment still
win, so one setting on a worker overrides every DAG:

- Spark master: ``enrich --master``, then ``SPARK_MASTER``, then the ``enrich_spark``
  connection, then the config's ``spark.master``, then ``local[2]``;
- state store: ``ENRICH_STATE_STORE``, then the ``enrich_state_store`` connection, then the
  config's ``warehouse.state_store``, then SQLite under the warehouse;
- object store: the ``AWS_*`` variables of the process, else the ``enrich_object_store``
  connection (type ``aws``: login the access key id, password the secret; extra
  ``endpoint_url`` and ``region_name``), else the AWS SDK's own defaults.

The conversions are plain functions of the connection's fields (:class:`ConnectionFields`)
so they are tested without Airflow; only :func:`lookup` imports it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.errors import ConfigError

logger = logging.getLogger(__name__)

SPARK_CONNECTION = "enrich_spark"
STATE_STORE_CONNECTION = "enrich_state_store"
OBJECT_STORE_CONNECTION = "enrich_object_store"
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
    extra: Mapping[str, Any] = field(default_factory=dict)

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
            extra=dict(connection.extra_dejson or {}),
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


def object_store_environment(connection: ConnectionFields) -> dict[str, str]:
    """The ``AWS_*`` variables of an ``aws`` connection (the Amazon provider's fields:
    login/password the key pair, extra ``endpoint_url``, ``region_name``)."""
    if connection.conn_type not in ("aws", "s3"):
        raise ConfigError(
            f"Airflow connection {connection.conn_id!r}: expected conn_type 'aws' (an "
            f"S3-compatible object store), found {connection.conn_type!r}"
        )
    if (connection.login is None) != (connection.password is None):
        raise ConfigError(
            f"Airflow connection {connection.conn_id!r}: expected both login (the access key "
            "id) and password (the secret access key), or neither"
        )
    environment: dict[str, str] = {}
    if connection.login is not None and connection.password is not None:
        environment["AWS_ACCESS_KEY_ID"] = connection.login
        environment["AWS_SECRET_ACCESS_KEY"] = connection.password
    endpoint = connection.extra.get("endpoint_url") or connection.host
    if endpoint:
        environment["AWS_ENDPOINT_URL"] = str(endpoint)
    region = connection.extra.get("region_name")
    if region:
        environment["AWS_REGION"] = str(region)
    return environment


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
