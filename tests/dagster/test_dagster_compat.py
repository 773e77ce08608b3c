"""`xirang_platform/dagster_compat.py` was written for one Dagster release: on another, this fails
first and says what to re-check (the module's docstring lists it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import dagster
import pytest
from dagster import SensorEvaluationContext

from xirang_platform.dagster_compat import DAGSTER_VERSION, is_daemon_tick

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_dagster_is_the_one_the_compat_module_was_written_for() -> None:
    assert dagster.__version__ == DAGSTER_VERSION, (
        f"dagster {dagster.__version__} is installed, xirang_platform/dagster_compat.py was written for "
        f"{DAGSTER_VERSION}: re-check its private imports, `is_daemon_tick` (the daemon's log key) and "
        "`write_run_tags` (SqlRunStorage.add_run_tags) against the new release, run tests/dagster, then "
        "move DAGSTER_VERSION and the pins in pyproject.toml together"
    )


def test_pyproject_pins_the_same_dagster() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    assert f"dagster=={DAGSTER_VERSION}" in deps


@pytest.mark.parametrize(
    ("log_key", "daemon"),
    [
        pytest.param(["repo", "xirang_scheduling_tick", "42"], True, id="the daemon names the key after its tick id"),
        pytest.param(None, False, id="a direct call carries no key: a dry run"),
        pytest.param(
            ["repo", "xirang_scheduling_tick", "20261205_101500"], False, id="a timestamped key: the UI's Test sensor"
        ),
    ],
)
def test_a_tick_is_told_from_a_dry_run_by_its_log_key(log_key: list[str] | None, daemon: bool) -> None:
    context = SensorEvaluationContext(instance_ref=None, log_key=log_key)  # as the daemon or the webserver builds it
    assert is_daemon_tick(context) is daemon
