"""The platform layer without Dagster: the platform config, run tags, preemption notices, the tenants
file and the input rules, over plain data (DESIGN.md section 2)."""
