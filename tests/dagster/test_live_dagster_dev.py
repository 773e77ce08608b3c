"""The real `dagster dev` (webserver, daemon, code servers) with the platform, driven through GraphQL.

Every process a server started is ended when its test finishes, passing or not. The lifecycle test
runs the repository's `dagster.yaml` as is (one process per run); the fifty-submission test swaps in
Dagster's `SyncInMemoryRunLauncher` (runs execute inside the daemon), because fifty run processes
take many minutes on a two-core machine and what it checks is admission under concurrent submissions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster_graphql import DagsterGraphQLClient

from tests.dagster.live_platform import IN_PROCESS_LAUNCHER, live_home
from tests.waiting import wait_for
from xirang_platform.control import run_tags as rt
from xirang_platform.devtools import devserver
from xirang_platform.devtools.live_scene import run_state, start_sweep, write_live_platform
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.rebuild import cap_violations

TERMINAL = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
SWEEP = {"ops": {"research__architecture_sweep": {"config": {"widths": [16], "epochs": 30, "epoch_pause_s": 1.0}}}}
QUICK_LIFECYCLE = {"ops": {"research__trained_model": {"config": {"epochs": 5}}}}


class Live:
    """The running server, its GraphQL client and the ledger it writes."""

    def __init__(self, server: devserver.DevServer, ledger: Ledger) -> None:
        self.server = server
        self.ledger = ledger

    def client(self) -> DagsterGraphQLClient:
        return DagsterGraphQLClient("127.0.0.1", port_number=self.server.port, timeout=120)

    def run(self, run_id: str) -> tuple[str, dict[str, str]]:
        return run_state(self.server, run_id)

    def wait_ended(self, run_ids: list[str], timeout: float = 600) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            statuses = {r: self.run(r)[0] for r in run_ids}
            if all(DagsterRunStatus(s) in TERMINAL for s in statuses.values()):
                return statuses
            assert time.monotonic() < deadline, f"runs not ended: {statuses}\n{self.server.tail()}"
            time.sleep(1)


@contextmanager
def started(tmp: Path, launcher: dict | None = None) -> Iterator[Live]:
    config = write_live_platform(tmp)
    home = live_home(tmp, config, launcher)
    with devserver.running(home, env={"XIRANG_CONFIG": str(config)}) as server:
        ledger = Ledger(f"sqlite:///{tmp / 'ledger.sqlite'}")
        try:
            yield Live(server, ledger)
        finally:
            ledger.close()


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    with started(tmp_path) as server:
        yield server


@pytest.fixture
def live_in_process(tmp_path: Path) -> Iterator[Live]:
    with started(tmp_path, IN_PROCESS_LAUNCHER) as server:
        yield server


def test_a_lifecycle_run_is_held_with_its_reason_then_admitted_and_succeeds(live: Live) -> None:
    client = live.client()
    sweep = start_sweep(client, live.server, SWEEP)
    lifecycle = client.submit_job_execution("lifecycle", "research", "__repository__", run_config=QUICK_LIFECYCLE)
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 600
    while not seen or DagsterRunStatus(seen[-1][0]) not in TERMINAL:
        assert time.monotonic() < deadline, f"lifecycle run stuck: {seen[-3:]}\n{live.server.tail()}"
        status, tags = live.run(lifecycle)
        step = (status, tags.get(rt.HOLD_REASON, ""))
        if not seen or seen[-1] != step:
            seen.append(step)
        time.sleep(0.5)
    statuses = [s for s, _ in seen]
    assert statuses[-1] == "SUCCESS", seen
    assert statuses.index("QUEUED") < statuses.index("STARTED") < statuses.index("SUCCESS")
    held = [reason for status, reason in seen if status == "QUEUED" and "GPU" in reason]
    assert held, f"no hold reason naming GPUs while queued: {seen}"
    assert live.run(sweep)[0] == "SUCCESS"
    _, tags = live.run(lifecycle)
    assert tags[rt.TENANT] == "research"
    assert tags[rt.PRIORITY] == str(rt.PRIORITY_BY_RANK[1])


ASKS = [
    {rt.TIER: "inference", rt.GPU_MILLI: "250"},
    {rt.TIER: "online-training", rt.GPUS: "2"},
    {rt.TIER: "offline-training", rt.GPUS: "1"},
    {rt.TIER: "batch-inference", rt.GPU_MILLI: "500"},
    {rt.TIER: "offline-training", rt.GPUS: "3"},
]


def test_fifty_concurrent_submissions_keep_every_tenant_under_its_cap_and_all_end(live_in_process: Live) -> None:
    live = live_in_process

    def submit(i: int) -> str:
        location = ("research", "product")[i % 2]
        project = {"research": "vision", "product": "serving"}[location]
        tags = {**ASKS[i % len(ASKS)], rt.PROJECT: project}
        return live.client().submit_job_execution("gpu_probe", location, "__repository__", run_config={}, tags=tags)

    with ThreadPoolExecutor(max_workers=10) as pool:
        run_ids = list(pool.map(submit, range(50)))
    statuses = live.wait_ended(run_ids)
    assert set(statuses.values()) == {"SUCCESS"}, statuses
    entries = live.ledger.entries()
    admitted = {e.request_id for e in entries if e.kind in ("reserve", "borrow")}  # in quota, or on idle GPUs
    assert admitted >= set(run_ids)
    assert cap_violations(entries) == []
    assert live.ledger.rebuild().ok
    wait_for(  # the release sensors give every allocation back
        "every allocation released",
        lambda: [a.id for a in live.ledger.allocations()],
        done=lambda held: not held,
        every_s=1,
    )
