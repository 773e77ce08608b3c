"""The engine end to end, in process: the real coordinator, the real queue daemon iteration, the
platform's tick and release sensors, runs that really execute; once on SQLite and once on
dagster-postgres (a fresh database per test, dropped after).

Pool (tests/dagster/pool.yaml): two 8-GPU H100 servers in one domain and one 4 x L40S server.
Quotas: research 12 GPUs (cap 14.4 at ratio 1.2), product 8 GPUs (cap 9.6).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dagster import DagsterRunStatus

import sensors.scheduling_tick as tick_module
from tests.dagster.engine_harness import Engine, engine, request
from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.ledger.counters import Event
from xirang_platform.ledger.read_only import read_figures

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SUCCESS, FAILURE, CANCELED, QUEUED = (
    DagsterRunStatus.SUCCESS,
    DagsterRunStatus.FAILURE,
    DagsterRunStatus.CANCELED,
    DagsterRunStatus.QUEUED,
)


@pytest.fixture(params=BACKENDS)
def e(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    with engine(tmp_path, request.param) as platform:
        yield platform


def entries(e: Engine, kind: str) -> list[str]:
    """Request ids of the ledger's entries of `kind` on tenant accounts, in order."""
    return [x.request_id for x in e.ledger.entries(kind=kind) if x.account.count("/") == 0]


def test_higher_tiers_are_admitted_and_launched_first(e: Engine) -> None:
    # Two 8-GPU gangs fit the pool's H100s. Submitted in order P2, P2, P1: the P1 gang and the
    # older P2 gang are admitted, the younger P2 waits; the daemon launches P1 before P2.
    older = e.submit("research", "gpu_job", request("offline-training", 8, project="llm"))
    younger = e.submit("research", "gpu_job", request("offline-training", 8, project="vision"))
    online = e.submit("product", "gpu_job", request("online-training", 8))
    assert [e.tag(r, rt.PRIORITY) for r in (older, younger, online)] == ["0", "0", "100"]

    report = e.tick()

    assert sorted(report.admitted) == sorted([online, older])
    assert e.tag(younger, rt.GATE) == "capacity"
    assert e.tag(younger, rt.HOLD_REASON).startswith("capacity: no room for 8 GPUs now")
    assert e.tag(younger, rt.POSITION) == "#1 in offline-training"
    e.dequeue()
    assert e.launched() == [online, older]
    assert e.status(younger) == QUEUED


def test_a_run_over_its_quota_waits_with_the_reason_and_runs_after_a_release(e: Engine) -> None:
    # Inference may not borrow: research's cap is 14.4 GPUs, two 8-GPU replicas make 16.
    first = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    second = e.submit("research", "gpu_job", request("inference", 8, project="llm"))

    report = e.tick()

    assert report.admitted == [first]
    reason = "quota: tenant research at its cap, 8 of 14.4 GPUs held, 8 asked (inference may not borrow)"
    assert e.tag(second, rt.HOLD_REASON) == reason
    assert (e.tag(second, rt.GATE), e.tag(second, rt.POSITION)) == ("quota", "#1 in inference")
    assert f"held: {reason}" in e.messages(second)
    e.dequeue()
    assert e.status(first) == SUCCESS
    assert e.status(second) == QUEUED
    assert e.release_sensors(first) == ["xirang_release_on_success"]
    assert e.held() == set()

    assert e.tick().admitted == [second]
    queue_tags = (rt.HOLD_REASON, rt.POSITION, rt.ESTIMATED_START)
    assert (e.tag(second, rt.GATE), [e.tag(second, k) for k in queue_tags]) == ("open", ["", "", ""])
    e.dequeue()
    assert e.status(second) == SUCCESS


def test_a_held_run_gets_a_new_event_only_when_its_reason_changes_not_its_place(e: Engine) -> None:
    # research's cap is 14.4 GPUs: one 8-GPU replica runs, the next two wait in line for quota.
    first = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    second = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    third = e.submit("research", "gpu_job", request("inference", 8, project="llm"))
    assert e.tick().admitted == [first]
    cause = "quota: tenant research at its cap, 8 of 14.4 GPUs held, 8 asked (inference may not borrow)"
    assert (e.tag(third, rt.HOLD_REASON), e.tag(third, rt.POSITION)) == (cause, "#2 in inference")

    e.instance.run_coordinator.cancel_run(second)
    report = e.tick()

    assert (e.tag(third, rt.HOLD_REASON), e.tag(third, rt.POSITION)) == (cause, "#1 in inference")  # its new place
    assert [m for m in e.messages(third) if m.startswith("held: ")] == [f"held: {cause}"]
    assert (report.counts["queue tags written"], report.counts["hold reasons changed"]) == (1, 0)
    assert e.tick().counts["queue tags written"] == 0  # nothing changed: nothing written


def test_runs_are_charged_to_the_tenant_of_their_code_location(e: Engine) -> None:
    product_run = e.submit("product", "gpu_job", request("offline-training", 2))
    intruder = e.submit("product", "gpu_job", request("offline-training", 2, tenant="research", project="llm"))

    e.tick()

    assert e.tag(product_run, rt.TENANT) == "product"
    assert [a.request.tenant for a in e.ledger.allocations()] == ["product"]
    assert e.status(intruder) == FAILURE
    assert any("xirang/tenant='research' names another tenant" in m for m in e.messages(intruder))


@pytest.mark.parametrize(
    ("tags", "problem"),
    [
        pytest.param(
            {**request("inference", project="llm"), rt.GPUS: "x"}, "xirang/gpus='x' is not a whole number", id="gpus"
        ),
        pytest.param(request("gold", 1, project="llm"), "xirang/tier='gold' is not a tier: use one of", id="tier"),
        pytest.param(
            request("inference", 1, project="ads"),
            "xirang/project='ads' is not a project of tenant 'research'",
            id="project",
        ),
        pytest.param(
            request("inference", 1, project="llm", gpu_model="B300"),
            "xirang/gpu-model: unknown GPU model 'B300'",
            id="model",
        ),
    ],
)
def test_a_run_with_a_bad_tag_fails_at_submission_and_nothing_is_reserved(e: Engine, tags: dict, problem: str) -> None:
    run = e.submit("research", "gpu_job", tags)

    assert e.status(run) == FAILURE
    assert any(m.startswith(f"run not admitted: {problem}") for m in e.messages(run)), e.messages(run)
    e.tick()
    e.dequeue()
    assert e.ledger.allocations(live=False) == []
    assert entries(e, "reserve") == []


def test_a_run_asking_for_no_gpu_passes_ungated(e: Engine) -> None:
    run = e.submit("research", "gpu_job", {})

    assert e.tag(run, rt.GATE) == "none"
    e.dequeue()  # no tick needed
    assert e.status(run) == SUCCESS
    assert e.ledger.allocations(live=False) == []


def test_a_failed_run_releases_its_allocation(e: Engine) -> None:
    run = e.submit("research", "gpu_job", request("offline-training", 4, project="llm") | {"test/outcome": "fail"})
    e.tick()
    e.dequeue()

    assert e.status(run) == FAILURE
    assert e.held() == {run}
    assert e.release_sensors(run) == ["xirang_release_on_failure"]
    assert e.held() == set()
    assert [x.cause for x in e.ledger.entries(kind="release") if x.request_id == run][0] == "failed"


def test_a_canceled_run_releases_its_allocation(e: Engine) -> None:
    run = e.submit("research", "gpu_job", request("offline-training", 4, project="llm"))
    e.tick()
    assert e.held() == {run}

    e.instance.run_coordinator.cancel_run(run)  # canceled after admission, before launch

    assert e.status(run) == CANCELED
    assert e.release_sensors(run) == ["xirang_release_on_cancel"]
    assert e.held() == set()
    e.dequeue()
    assert e.launched() == []


def test_a_tick_that_crashes_between_the_ledger_and_the_gate_is_repaired_by_the_next(
    e: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = e.submit("research", "gpu_job", request("online-training", 2, project="llm"))

    def crash(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the tick's process died here")

    with monkeypatch.context() as m:
        m.setattr(tick_module, "open_gates", crash)
        with pytest.raises(RuntimeError, match="died here"):
            e.tick()
    assert e.held() == {run}  # the ledger write happened
    assert e.tag(run, rt.GATE) == "queued"  # the gate did not open
    e.dequeue()
    assert e.launched() == []

    placed = e.ledger.allocations()[0].placement
    report = e.tick()

    assert report.repairs == [f"opened the gate of run {run}: the ledger held its allocation but the gate was closed"]
    assert e.tag(run, rt.GATE) == "open"
    tagged = run_allocation.read_allocation_tag(e.tag(run, rt.ALLOCATION))
    assert tagged is not None
    assert [(s.node, s.gpu) for s in placed.slices] == [(n, g) for n, g, _, _ in tagged.gpus]
    assert e.held() == {run}
    assert len(e.ledger.allocations()) == 1
    e.dequeue()
    assert e.launched() == [run]


def test_a_short_run_the_tick_sees_end_first_is_released_routinely_not_repaired(e: Engine) -> None:
    # issue 31: on a fresh instance every short run counted as a reconcile "repair": the tick saw it
    # end before the release sensor's first evaluation.
    run = e.submit("research", "gpu_job", request("offline-training", 4, project="llm"))
    e.tick()
    e.dequeue()
    assert e.status(run) == SUCCESS
    assert e.held() == {run}

    report = e.tick()

    assert e.held() == set()
    assert (report.repairs, report.counts["repairs"]) == ([], 0)
    [release] = [x for x in e.ledger.entries(kind="release") if x.account == "research"]
    assert (release.request_id, release.cause) == (run, "finished")  # as the release sensor writes it
    assert [c for c in read_figures(e.ledger).events if c.event is Event.REPAIR] == []
    e.release_sensors(run)  # the sensor, late, finds nothing left to release
    assert len(e.ledger.entries(kind="release")) == 2  # the tenant's and the project's entry, once


def test_an_asset_run_is_admitted_from_what_its_assets_declare(e: Engine) -> None:
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    run = e.submit("research", "train_job")  # no xirang tags: `train` declares 8 GPUs, offline-training

    assert e.tag(run, rt.GPUS) == "8"
    assert e.tag(run, rt.TIER) == "offline-training"
    assert e.tag(run, rt.GATE) == "queued"
    e.tick()
    e.dequeue()
    assert e.status(run) == SUCCESS
    allocation = run_allocation.read_allocation_tag(e.tag(run, rt.ALLOCATION))
    assert allocation is not None
    devices = ",".join(str(g) for g in allocation.device_ids())
    assert any(m.endswith(f"CUDA_VISIBLE_DEVICES={devices}") for m in e.messages(run))  # set while it ran
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before  # and put back after
    assert allocation is not None
    assert allocation.gpu_count == 8
    assert allocation.node.startswith("h100-")


def test_a_run_no_node_of_the_pool_could_ever_hold_fails_with_the_reason(e: Engine) -> None:
    impossible = e.submit("research", "gpu_job", request("online-training", 24, project="llm"))  # the pool has 20

    report = e.tick()

    assert report.failed == [impossible]
    assert e.status(impossible) == FAILURE
    assert any(m.startswith("run not admitted: never-fits:") for m in e.messages(impossible)), e.messages(impossible)
    assert e.ledger.allocations(live=False) == []
