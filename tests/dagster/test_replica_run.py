"""A serving replica run through the real Dagster path: the coordinator and the tick admit it, the code
server starts its process (DefaultRunLauncher), it serves HTTP until a scale-down asks it to stop (it
drains and succeeds) or it is cancelled (it drains and ends canceled)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from dagster import DagsterEventType, DagsterRunStatus

from sensors.autoscaling import stop_replica
from tests.serving.serving_helpers import body, digits, digits_model
from xirang_platform.dagster_defs.assets.serving import deploy
from xirang_platform.devtools.demo import DEMO_PLATFORM, DEMO_POOL, settle_processes
from xirang_platform.devtools.embedded import TERMINAL, embedded_platform, write_platform
from xirang_platform.serving import registry


@contextmanager
def serving_replica(tmp_path: Path) -> Iterator[tuple[Any, str, Path]]:
    """The embedded platform with product's model deployed and one replica run registered and serving:
    (the platform, the run id, the registry); every run process is settled afterwards."""
    config, home = write_platform(tmp_path, DEMO_PLATFORM, DEMO_POOL)
    with embedded_platform(config, home) as platform:
        try:
            deploy(platform.instance.storage_directory(), "product", digits_model(), "deploying-run")
            run_id = platform.submit(
                "product", "inference_replica", {"ops": {"serve": {"config": {"drain_grace_s": 0.5}}}}
            )
            directory = registry.registry_dir()
            platform.wait("the replica registered", lambda: bool(registry.endpoints(directory, "product")))
            yield platform, run_id, directory
        finally:
            settle_processes(platform.instance)


@pytest.fixture(autouse=True)
def registry_under_dagster_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(registry.REGISTRY_ENV, raising=False)  # the registry under the platform's DAGSTER_HOME


def test_a_replica_run_serves_until_cancelled_then_drains_and_ends_canceled(tmp_path: Path) -> None:
    x, _ = digits()
    with serving_replica(tmp_path) as (platform, run_id, directory):
        (endpoint,) = registry.endpoints(directory, "product")
        answer = httpx.post(f"{endpoint.url}/predict", json=body(rows=3, offset=900), timeout=10)
        status_while_serving = platform.status(run_id)
        platform.instance.run_coordinator.cancel_run(run_id)
        platform.wait("the replica run ended", lambda: platform.status(run_id) in TERMINAL)
        listed_after = registry.endpoints(directory, "product")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{endpoint.url}/ready", timeout=5)
        logs = [
            r.event_log_entry.user_message
            for r in platform.instance.get_records_for_run(run_id).records
            if r.event_log_entry.dagster_event is None
            or r.event_log_entry.dagster_event.event_type != DagsterEventType.ENGINE_EVENT
        ]
    assert directory == Path(platform.instance.root_directory) / "xirang-serving" / "endpoints"
    assert (endpoint.run_id, endpoint.model_version) == (run_id, "1")
    assert status_while_serving == DagsterRunStatus.STARTED
    assert answer.status_code == 200
    assert answer.json()["predictions"] == digits_model().predict(x[900:903]).tolist()
    assert platform.status(run_id) == DagsterRunStatus.CANCELED
    assert listed_after == []
    assert any("answered 1 prediction requests" in m for m in logs), logs


def test_a_scaled_down_replica_drains_and_its_run_succeeds_with_no_error_event(tmp_path: Path) -> None:
    # issue 31: every scale-down was a STEP_FAILURE with DagsterExecutionInterruptedError's stack trace.
    why = "autoscaler: product scales from 1 to 0 replicas (load 0.0)"
    with serving_replica(tmp_path) as (platform, run_id, directory):
        stop_replica(platform.instance, platform.instance.get_run_by_id(run_id), why, 0.0)
        platform.wait("the replica run ended", lambda: platform.status(run_id) in TERMINAL)
        entries = platform.instance.all_logs(run_id)
        listed_after = registry.endpoints(directory, "product")
    assert platform.status(run_id) == DagsterRunStatus.SUCCESS
    assert [(e.dagster_event_type, e.message) for e in entries if e.level >= logging.ERROR] == []
    assert f"scaled down ({why}): the replica drained and stops" in [e.message for e in entries]
    assert listed_after == []
