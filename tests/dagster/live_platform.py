"""Builders for the tests that run the real `dagster dev`: a temporary home (the platform: `live_scene.py`)."""

from __future__ import annotations

from pathlib import Path

import yaml

from xirang_platform.dagster_compat import SYNC_IN_MEMORY_RUN_LAUNCHER
from xirang_platform.devtools import devserver

IN_PROCESS_LAUNCHER = SYNC_IN_MEMORY_RUN_LAUNCHER


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
