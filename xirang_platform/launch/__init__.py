"""Launchers: how an admitted allocation reaches the process or pod that runs it (no Dagster here)."""
