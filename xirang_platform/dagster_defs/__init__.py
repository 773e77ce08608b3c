"""The Dagster layer inside the package: the run coordinator, the code locations' definitions, the
tenants' assets and the reading of a run's worker from its run log (DESIGN.md section 2)."""
