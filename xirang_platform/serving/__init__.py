"""Inference serving: replicas that answer HTTP predictions, where they register, and the load generator.

No Dagster here (the replica job in `xirang_platform/assets/serving.py` wraps `replica.Replica`).
"""
