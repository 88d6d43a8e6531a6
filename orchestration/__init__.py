"""Airflow glue above the ``enrich`` jobs: the callables the DAGs run, a self-contained
Airflow home for embedded runs, and ``make demo``'s driver.

Nothing here is imported by the library packages; the jobs are the layer below.
"""
