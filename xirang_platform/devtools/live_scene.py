"""The small live platform on which a run is seen held with its reason (the live `dagster dev` tests
and the UI screenshots): four H100s and two L40S inference cards, two tenants, and an offline sweep
pinned to the H100s so that research's 4-GPU lifecycle gang waits for them.

No Dagster import here (like `devserver.py`): the GraphQL client is passed in (`JobSubmitter`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from xirang_platform.control import run_tags as rt
from xirang_platform.devtools.devserver import DevServer

LIVE_POOL = {
    "schema_version": 1,
    "name": "live",
    "unit_milli": {"L40S": 125},
    "nodes": [
        {"name": "h100-00", "model": "H100-SXM", "gpus": 4, "cpu": 96, "memory": "1Ti", "domain": "nvl-a"},
        # Two inference cards: too few for the research lifecycle's 4-GPU gang, which must wait for the H100s.
        {"name": "l40s-00", "model": "L40S", "gpus": 2, "cpu": 64, "memory": "512Gi"},
    ],
}
# The sweep's own request, pinned to the H100s so that the lifecycle's 4-GPU gang has to wait for them.
ON_THE_H100S = {rt.TIER: "offline-training", rt.GPUS: "2", rt.PROJECT: "vision", rt.GPU_MODEL: "H100-SXM"}
RUN_QUERY = "query Run($id: ID!) { runOrError(runId: $id) { ... on Run { status tags { key value } } } }"
ENDED = ("SUCCESS", "FAILURE", "CANCELED")


class JobSubmitter(Protocol):
    """What these scenes ask of `dagster_graphql.DagsterGraphQLClient`: submitting a job."""

    def submit_job_execution(
        self,
        job_name: str,
        repository_location_name: str | None = None,
        repository_name: str | None = None,
        run_config: Mapping[str, Any] | None = None,
        tags: dict[str, Any] | None = None,
        op_selection: Sequence[str] | None = None,
        asset_selection: Sequence[Sequence[str]] | None = None,
    ) -> str:
        """Submit `job_name` of a code location's repository; the new run's id."""
        ...


MIN_RUNTIME_S = 3600  # the scene's minimum runtime: a run is preemptible after its first hour


def live_platform_doc(
    research_gpus: float = 4, product_gpus: float = 4, min_runtime_s: int = MIN_RUNTIME_S
) -> dict[str, Any]:
    """The platform config (pool file `pool.yaml`, a SQLite ledger beside it, a 1 s tick); preemption
    is off for the first `min_runtime_s` of a run."""
    return {
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


def write_live_platform(workdir: Path, **doc: Any) -> Path:
    """`LIVE_POOL` and `live_platform_doc(**doc)` written under `workdir`; the config's path."""
    (workdir / "pool.yaml").write_text(yaml.safe_dump(LIVE_POOL, sort_keys=False))
    config = workdir / "xirang.yaml"
    config.write_text(yaml.safe_dump(live_platform_doc(**doc), sort_keys=False))
    return config


def run_state(server: DevServer, run_id: str) -> tuple[str, dict[str, str]]:
    """A run's status and tags, through the webserver's GraphQL."""
    data = server.graphql(RUN_QUERY, {"id": run_id})["runOrError"]
    return data["status"], {t["key"]: t["value"] for t in data["tags"]}


def submit_sweep(client: JobSubmitter, run_config: dict[str, Any], gpus: int = 2) -> str:
    """Submit research's architecture sweep on `gpus` of the H100s; its run id."""
    return str(
        client.submit_job_execution(
            "__ASSET_JOB",
            "research",
            "__repository__",
            run_config=run_config,
            asset_selection=[["research", "architecture_sweep"]],
            tags={**ON_THE_H100S, rt.GPUS: str(gpus)},
        )
    )


def start_sweep(
    client: JobSubmitter,
    server: DevServer,
    run_config: dict[str, Any],
    timeout: float = 600,
    *,
    gpus: int = 2,
    until: str = "STARTED",
) -> str:
    """`submit_sweep`, then wait until it is `until` (`STARTED`, or `SUCCESS` for one that ends); its run
    id. A `RuntimeError` with the server's log if it ends otherwise or waits `timeout` s first."""
    sweep = submit_sweep(client, run_config, gpus)
    deadline = time.monotonic() + timeout
    while (status := run_state(server, sweep)[0]) != until:
        if (status in ENDED and status != until) or time.monotonic() > deadline:
            raise RuntimeError(f"the sweep did not reach {until} (it is {status}):\n{server.tail()}")
        time.sleep(0.5)
    return sweep


def hold_lifecycle(client: JobSubmitter, server: DevServer, timeout: float = 600) -> tuple[str, str]:
    """Submit research's lifecycle run (a 4-GPU gang) while the sweep holds the H100s and wait until the
    scheduler holds it for GPUs; its run id and hold reason. A `RuntimeError` with the server's log if it
    is not held within `timeout` s."""
    run_id = str(client.submit_job_execution("lifecycle", "research", "__repository__"))
    deadline = time.monotonic() + timeout
    while "GPU" not in (reason := run_state(server, run_id)[1].get(rt.HOLD_REASON, "")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the lifecycle run was not held for GPUs (hold reason {reason!r}):\n{server.tail()}")
        time.sleep(0.5)
    return run_id, reason
