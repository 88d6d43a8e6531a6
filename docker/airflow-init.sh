#!/bin/sh
# One-shot set-up before Airflow's services start: migrate the metadata database, create
# the pool that bounds concurrent Spark tasks, and write the pipeline's DAG files from the
# config the team runs ($ENRICH_CONFIG).
set -eu
airflow db migrate
airflow pools set "${ENRICH_POOL:-enrich_spark}" "${ENRICH_POOL_SLOTS:-1}" \
    "concurrent Spark drivers of the enrichment pipeline"
enrich --config "${ENRICH_CONFIG:?set ENRICH_CONFIG}" generate-dag --out "${AIRFLOW__CORE__DAGS_FOLDER:?}/enrich_pipeline.py"
