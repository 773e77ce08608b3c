"""A bad edit of the platform config while the platform runs (issue 31: the tick kept admitting and
said nothing, the next run failed at its start with a `PlatformConfigError` stack trace). Now the
tick keeps admitting on the last good config and says why in its message (the tick history, the
UI's "Test sensor"), the exporter serves `xirang_config_ok 0` with the reason, and a run started
meanwhile, in a process of its own, runs on the last good config."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, DagsterRunStatus
from dagster_graphql.test.utils import execute_dagster_graphql

from sensors.scheduling_tick import TICK_SENSOR_NAME
from tests.dagster.engine_harness import DRY_RUN_MUTATION, Engine, engine, request
from tests.operations.ops_helpers import labels, scraped
from xirang_platform.control import run_tags as rt
from xirang_platform.control.live_config import read_live
from xirang_platform.devtools.demo import DEMO_PLATFORM, DEMO_POOL, settle_processes
from xirang_platform.devtools.embedded import TERMINAL, embedded_platform, write_platform
from xirang_platform.operations.exporter import XirangCollector

PROBLEM = "quota '8 GPUs' is not a number of GPUs: write it like 8 or 0.5"


def break_quota(config: Path, quota: int) -> None:
    """Edit the config as a person might: a tenant's quota written with its unit."""
    text = config.read_text(encoding="utf-8")
    bad = text.replace(f"quota_gpus: {quota}\n", "quota_gpus: 8 GPUs\n", 1)
    assert bad != text
    config.write_text(bad, encoding="utf-8")
    later = time.time_ns() + 10**9  # a new modification time, whatever the clock's resolution
    os.utime(config, ns=(later, later))


def last_tick_message(instance: DagsterInstance, sensor: str = TICK_SENSOR_NAME) -> str:
    """The message of the sensor's latest tick in the tick history (what the UI lists)."""
    [state] = [s for s in instance.all_instigator_state() if s.instigator_name == sensor]
    [tick] = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=1)
    return str(tick.skip_reason)


@pytest.fixture
def e(tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, "sqlite") as platform:
        yield platform


def test_after_a_bad_edit_the_tick_admits_on_the_last_good_config_and_says_why(e: Engine, tmp_path: Path) -> None:
    e.tick()  # the platform runs on the good config
    break_quota(tmp_path / "xirang.yaml", 12)
    run = e.submit("research", "gpu_job", request("offline-training", 2, project="llm"))

    e.sensors()  # the sensor daemon's tick

    assert e.tag(run, rt.GATE) == rt.GATE_OPEN
    message = last_tick_message(e.instance)
    assert message.startswith("platform config not applied: ")
    assert PROBLEM in message
    assert "the platform runs on its last good config until then | tick: gated 1" in message
    selector = {
        "repositoryLocationName": "research",
        "repositoryName": "__repository__",
        "sensorName": TICK_SENSOR_NAME,
    }
    dry = execute_dagster_graphql(e.workspace.create_request_context(), DRY_RUN_MUTATION, {"selector": selector})
    assert PROBLEM in dry.data["sensorDryRun"]["evaluationResult"]["skipReason"]  # the UI's "Test sensor"


def test_the_exporter_serves_whether_the_config_file_is_in_force_and_why_not(e: Engine, tmp_path: Path) -> None:
    config = tmp_path / "xirang.yaml"
    platform = read_live(config).config
    collector = XirangCollector(
        e.ledger, e.instance, platform.pool, platform.overcommit, config_problem=lambda: read_live(config).problem
    )
    before = scraped(collector)
    break_quota(config, 12)
    after = scraped(collector)

    assert (before["xirang_config_ok"], before.get("xirang_config_problem")) == ({(): 1.0}, None)
    assert after["xirang_config_ok"] == {(): 0.0}
    [(key, value)] = after["xirang_config_problem"].items()
    assert value == 1.0
    assert PROBLEM in dict(key)["problem"]
    assert key == labels(problem=read_live(config).problem or "")


def test_a_run_started_after_a_bad_edit_runs_on_the_last_good_config(tmp_path: Path) -> None:
    config, home = write_platform(tmp_path, DEMO_PLATFORM, DEMO_POOL)
    with embedded_platform(config, home) as platform:
        try:
            platform.wait("the tick's first message", lambda: tick_ran(platform.instance))
            break_quota(config, 4)  # research's quota, while the code servers run
            run_id = platform.submit("research", "gpu_probe", tags={rt.TIER: "inference", rt.GPU_MILLI: "250"})
            platform.wait("the probe run ended", lambda: platform.status(run_id) in TERMINAL)
            messages = [x.message for x in platform.instance.all_logs(run_id)]
            platform.wait("a tick on the bad file", lambda: PROBLEM in last_tick_message(platform.instance))
        finally:
            settle_processes(platform.instance)
    assert platform.status(run_id) == DagsterRunStatus.SUCCESS, messages
    assert not [m for m in messages if "PlatformConfigError" in m or "Traceback" in m]


def tick_ran(instance: Any) -> bool:
    return any(s.instigator_name == TICK_SENSOR_NAME for s in instance.all_instigator_state())
