"""Inference serving: replicas that answer HTTP predictions, where they register, and the load generator.

No Dagster here (the replica job in `xirang_platform/dagster_defs/assets/serving.py` wraps `replica.Replica`).
"""
