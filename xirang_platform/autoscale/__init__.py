"""Inference load for the autoscaler: trace readers (`load`) and the Prometheus HTTP API (`prometheus`).

The policy itself is pure and lives in the core (`xirang_platform/scheduling/autoscale.py`); these
modules only say what the load is. No Dagster here: the simulator and the live sensor both read them.
"""
