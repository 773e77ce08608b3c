"""A serving replica run through the real Dagster path: the coordinator and the tick admit it, the code
server starts its process (DefaultRunLauncher), it serves HTTP until cancelled, then drains and ends."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from dagster import DagsterEventType, DagsterRunStatus

from tests.serving.serving_helpers import body, digits, digits_model
from xirang_platform.dagster_defs.assets.serving import deploy
from xirang_platform.devtools.demo import DEMO_PLATFORM, DEMO_POOL, settle_processes
from xirang_platform.devtools.embedded import TERMINAL, embedded_platform, write_platform
from xirang_platform.serving import registry


def test_a_replica_run_serves_until_cancelled_then_drains_and_ends_canceled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(registry.REGISTRY_ENV, raising=False)  # the registry under the platform's DAGSTER_HOME
    config, home = write_platform(tmp_path, DEMO_PLATFORM, DEMO_POOL)
    x, _ = digits()
    with embedded_platform(config, home) as platform:
        try:
            deploy(platform.instance.storage_directory(), "product", digits_model(), "deploying-run")
            run_id = platform.submit(
                "product", "inference_replica", {"ops": {"serve": {"config": {"drain_grace_s": 0.5}}}}
            )
            directory = registry.registry_dir()
            platform.wait("the replica registered", lambda: bool(registry.endpoints(directory, "product")))
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
        finally:
            settle_processes(platform.instance)
    assert directory == home / "xirang-serving" / "endpoints"
    assert (endpoint.run_id, endpoint.model_version) == (run_id, "1")
    assert status_while_serving == DagsterRunStatus.STARTED
    assert answer.status_code == 200
    assert answer.json()["predictions"] == digits_model().predict(x[900:903]).tolist()
    assert platform.status(run_id) == DagsterRunStatus.CANCELED
    assert listed_after == []
    assert any("answered 1 prediction requests" in m for m in logs), logs
