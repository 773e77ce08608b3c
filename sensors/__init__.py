"""Dagster sensors (the scheduling tick, release on run end, inference-load autoscaling) live here.

Seam for the Dagster issue (DESIGN.md sections 2 and 7).
"""
