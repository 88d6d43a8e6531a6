"""Run reports: per-run series from the state store, rendered as one HTML file with plots."""
