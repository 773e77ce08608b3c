"""Dagster resources (GpuPoolResource, ledger and launcher resources) live here.

Seam for the Dagster issue: only this package, `sensors`, the coordinator, assets and definitions
import Dagster (DESIGN.md section 2).
"""
