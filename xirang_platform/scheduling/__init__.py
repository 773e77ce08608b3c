"""The scheduler core: tiers, queue order, placement and preemption plans over a snapshot.

`cycle(snapshot, pending, now)` is pure: no Dagster, SQL, Kubernetes or wall clock in here.
"""
