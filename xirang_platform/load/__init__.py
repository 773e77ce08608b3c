"""Inference load sources for the autoscaler: trace readers (`traces`), the Prometheus HTTP API
(`prometheus`) and the replicas' own `/metrics` (`scrape`); and the load generator that replays a
trace against a service's replicas (`generator`).

The policy itself is pure and lives in the core (`xirang_platform/scheduling/replica_scaling.py`);
the live services file that names each service's source is `xirang_platform/control/autoscaling_config.py`.
These modules only say what the load is. No Dagster here: the simulator and the live sensor both read them.
"""
