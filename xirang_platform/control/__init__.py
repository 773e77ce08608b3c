"""The platform layer without Dagster: the platform config, run tags, preemption notices, the tenants
file, over plain data (DESIGN.md section 2)."""
