"""Quality gates: expectation suites, audit views, the GX Checkpoint runner, outcomes."""
