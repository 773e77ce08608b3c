"""Xirang: one GPU pool for model training and inference, scheduled in tiers, orchestrated by Dagster."""

__version__ = "0.1.0"
