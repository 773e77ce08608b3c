"""Builders for the tests that run the real `dagster dev`: a small pool, two tenants, a temporary home."""

from __future__ import annotations

from pathlib import Path

import yaml

from xirang_platform import devserver

LIVE_POOL = {
    "schema_version": 1,
    "name": "live-test",
    "unit_milli": {"L40S": 125},
    "nodes": [
        {"name": "h100-00", "model": "H100-SXM", "gpus": 4, "cpu": 96, "memory": "1Ti", "domain": "nvl-a"},
        # Two inference cards: too few for the research lifecycle's 4-GPU gang, which must wait for the H100s.
        {"name": "l40s-00", "model": "L40S", "gpus": 2, "cpu": 64, "memory": "512Gi"},
    ],
}


def live_platform(tmp: Path, *, research_gpus: float = 4, product_gpus: float = 4, min_runtime_s: int = 3600) -> Path:
    """A platform config (pool, ledger, tenants) under `tmp`; preemption is off for the first `min_runtime_s`."""
    (tmp / "pool.yaml").write_text(yaml.safe_dump(LIVE_POOL, sort_keys=False))
    doc = {
        "pool": "pool.yaml",
        "ledger_url": "sqlite:///ledger.sqlite",
        "launcher": "local",
        "tenants": {
            "research": {"quota_gpus": research_gpus, "projects": {"vision": {}}},
            "product": {"quota_gpus": product_gpus, "projects": {"serving": {}}},
        },
        "locations": {"research": "research", "product": "product"},
        "tick": {"interval_s": 1, "location": "research"},
        "scheduler": {"min_runtime_s": min_runtime_s},
    }
    config = tmp / "xirang.yaml"
    config.write_text(yaml.safe_dump(doc, sort_keys=False))
    return config


IN_PROCESS_LAUNCHER = {
    "module": "dagster._core.launcher.sync_in_memory_run_launcher",
    "class": "SyncInMemoryRunLauncher",
}


def live_home(tmp: Path, config: Path, launcher: dict | None = None) -> Path:
    """A DAGSTER_HOME from the repository's `dagster.yaml`, its storage and platform config under `tmp`
    (and another run launcher, when given)."""
    home = devserver.prepare_home(tmp / "dagster")
    instance = yaml.safe_load((home / "dagster.yaml").read_text())
    instance["storage"] = {"sqlite": {"base_dir": str(home)}}
    instance["run_coordinator"]["config"]["platform_config"] = str(config)
    if launcher is not None:
        instance["run_launcher"] = launcher
    (home / "dagster.yaml").write_text(yaml.safe_dump(instance, sort_keys=False))
    return home
