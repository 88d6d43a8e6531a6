#!/bin/sh
# Runs once, on the first start of the postgres service (docker-entrypoint-initdb.d): one
# database and owner for Airflow's metadata, one for the pipeline's state store. The
# passwords come from the environment (.env), never from this file.
set -eu
: "${AIRFLOW_DB_PASSWORD:?set AIRFLOW_DB_PASSWORD in .env}"
: "${ENRICH_DB_PASSWORD:?set ENRICH_DB_PASSWORD in .env}"
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres <<SQL
CREATE ROLE airflow LOGIN PASSWORD '${AIRFLOW_DB_PASSWORD}';
CREATE DATABASE airflow OWNER airflow;
CREATE ROLE enrich LOGIN PASSWORD '${ENRICH_DB_PASSWORD}';
CREATE DATABASE enrich OWNER enrich;
SQL
