"""Fault-injection soak: seeded trials of the whole pipeline, killed and rerun, oracle-checked."""
