"""Run monitoring is on in every shipped instance (issue 20 item 6: crashed runs stayed STARTED for
20 minutes), with the timeouts the README's crash bound is made of."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance

from xirang_platform.dagster_compat import dagster_instance_config

REPO = Path(__file__).resolve().parents[2]
HELM_KEYS = {
    "enabled": "enabled",
    "startTimeoutSeconds": "start_timeout_seconds",
    "cancelTimeoutSeconds": "cancel_timeout_seconds",
    "pollIntervalSeconds": "poll_interval_seconds",
    "maxResumeRunAttempts": "max_resume_run_attempts",
}


def monitoring(tmp_path: Path, shipped: str) -> dict:
    shutil.copy(REPO / shipped, tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    return config["run_monitoring"]


@pytest.mark.parametrize("shipped", ["dagster.yaml", "deploy/dagster.yaml"])
def test_every_shipped_instance_monitors_runs_without_resuming_them(tmp_path: Path, shipped: str) -> None:
    settings = monitoring(tmp_path, shipped)
    assert settings["enabled"] is True
    assert settings["max_resume_run_attempts"] == 0  # the platform resumes, from its ledger's record
    # within the README's bounds: a stuck cancel ends within 5 minutes of polling, a start within 15
    assert settings["cancel_timeout_seconds"] + settings["poll_interval_seconds"] <= 330
    assert settings["start_timeout_seconds"] + settings["poll_interval_seconds"] <= 930


def test_the_embedded_instance_runs_the_monitoring_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copy(REPO / "dagster.yaml", tmp_path / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))  # its storage: the home it is copied to
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        assert (instance.run_monitoring_start_timeout_seconds, instance.run_monitoring_cancel_timeout_seconds) == (
            180,
            120,
        )


def test_the_helm_values_monitor_runs_as_deploy_dagster_yaml_does(tmp_path: Path) -> None:
    values = yaml.safe_load((REPO / "deploy/helm-values.yaml").read_text())["dagsterDaemon"]["runMonitoring"]
    assert {HELM_KEYS[k]: v for k, v in values.items()} == monitoring(tmp_path, "deploy/dagster.yaml")
