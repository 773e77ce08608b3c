"""Inference serving: replicas that answer HTTP predictions, where they register, and a service's fleet.

No Dagster here (the replica job in `xirang_platform/dagster_defs/assets/serving.py` wraps `replica.Replica`).
"""
