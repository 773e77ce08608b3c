"""The scheduling tick and the release sensors driving the Kubernetes launcher (`launcher: k8s`):
the engine harness's real Dagster instance, coordinator and ledger, and `K8sSubmitter` on the
recording fake API of the launcher's own tests (`tests/launch/fake_k8s.py`).

Pool (tests/dagster/pool.yaml): two 8-GPU H100 servers in one domain and one 4 x L40S server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterRunStatus, build_sensor_context

import sensors.scheduling_tick as tick_module
import xirang_platform.launch.launcher as launcher_module
from sensors.scheduling_tick import build_scheduling_tick
from tests.dagster.engine_harness import PLATFORM, Engine, engine, request
from tests.launch.fake_k8s import RecordingApi, api_error, pod_from
from xirang_platform.control import run_tags as rt
from xirang_platform.launch.k8s import claim_template_name
from xirang_platform.launch.k8s_cluster import K8sCluster
from xirang_platform.launch.k8s_gang import gang_objects
from xirang_platform.launch.k8s_pod import GATE, POD_NODES
from xirang_platform.launch.k8s_settings import GpuRequest, K8sSettings
from xirang_platform.launch.k8s_submit import K8sSubmitter
from xirang_platform.launch.launcher import use_cluster

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# research may hold a 16-GPU gang over both H100 servers in quota
K8S_PLATFORM: dict[str, Any] = {
    **PLATFORM,
    "launcher": "k8s",
    "tenants": {
        "research": {"quota_gpus": 16, "projects": {"llm": {}, "vision": {}}},
        "product": {"quota_gpus": 4, "projects": {"serving": {}}},
    },
}
GANG_TAGS = request("online-training", 16, project="llm")
FORBIDDEN = 'jobs.batch is forbidden: User "system:serviceaccount:xirang:dagster" cannot create resource "jobs"'


class Cluster:
    """The engine, the fake API, and what the fake had been asked when each run's gate opened."""

    def __init__(self, e: Engine, api: RecordingApi, settings: K8sSettings, patch: pytest.MonkeyPatch) -> None:
        self.e, self.api, self.settings = e, api, settings
        self.calls_at_gate: dict[str, list[str]] = {}
        open_gates = tick_module.open_gates  # the one place the tick's gates open

        def recording(instance: Any, tags_by_run: dict[str, dict[str, str]]) -> None:
            for run_id, tags in tags_by_run.items():
                if tags.get(rt.GATE) == rt.GATE_OPEN:
                    self.calls_at_gate[run_id] = self.api.methods()
            open_gates(instance, tags_by_run)

        patch.setattr(tick_module, "open_gates", recording)

    def allocation(self, run_id: str) -> Any:
        return next(a for a in self.e.ledger.allocations() if a.id == run_id)

    def since(self, mark: int) -> list[str]:
        return self.api.methods()[mark:]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def k8s_engine(tmp_path: Path, backend: str, settings: K8sSettings) -> Iterator[Cluster]:
    api = RecordingApi()
    submitter = K8sSubmitter(settings.namespace, api, api, api, api, api, retries=1, sleep=lambda _: None)
    with (
        engine(tmp_path, backend, K8S_PLATFORM) as e,
        use_cluster(K8sCluster(submitter, settings)),
        pytest.MonkeyPatch.context() as patch,
    ):
        yield Cluster(e, api, settings, patch)


@pytest.fixture
def k8s(tmp_path: Path, backend: str) -> Iterator[Cluster]:
    yield from k8s_engine(tmp_path, backend, K8sSettings())


@pytest.fixture
def k8s_dra(tmp_path: Path) -> Iterator[Cluster]:
    yield from k8s_engine(tmp_path, "sqlite", K8sSettings(gpu_request=GpuRequest.DRA))


def test_an_admitted_gang_gets_its_service_and_indexed_job_before_its_gate_opens(k8s: Cluster) -> None:
    gang = k8s.e.submit("research", "gpu_job", GANG_TAGS)

    assert k8s.e.tick().admitted == [gang]

    assert k8s.e.tag(gang, rt.GATE) == rt.GATE_OPEN
    before = k8s.calls_at_gate[gang]
    assert before.index("create_namespaced_service") < before.index("create_namespaced_job")
    job = k8s.api.store[
        f"Job/{gang_objects(k8s.allocation(gang), k8s.e.gpu_pool.pool(), k8s.settings).job.metadata.name}"
    ]
    assert (job.spec.completion_mode, job.spec.completions) == ("Indexed", 2)
    assert k8s.e.tag(gang, rt.K8S_CONFIG)  # the run worker's pod config, beside the gang's objects


def test_a_refused_launch_fails_the_run_with_the_message_keeps_its_gate_closed_and_reserves_nothing(
    k8s: Cluster,
) -> None:
    k8s.api.script("create_namespaced_job", api_error(403, "Forbidden", FORBIDDEN))
    gang = k8s.e.submit("research", "gpu_job", GANG_TAGS)

    report = k8s.e.tick()

    assert (report.admitted, report.failed) == ([], [gang])
    assert k8s.e.tag(gang, rt.GATE) == "queued"
    assert gang not in k8s.calls_at_gate
    assert k8s.e.status(gang) == DagsterRunStatus.FAILURE
    reason = k8s.e.tag(gang, rt.HOLD_REASON) or ""
    assert reason.startswith("run not admitted: the cluster refused its launch: create Job xirang/")
    assert "forbidden" in reason
    assert "deploy/rbac.yaml" in reason  # the fix the launcher names
    assert k8s.e.held() == set()
    assert [x.request_id for x in k8s.e.ledger.entries(kind="release") if "/" not in x.account] == [gang]
    # the Service created before the refusal is deleted again
    assert "delete_namespaced_service" in k8s.api.methods()
    # the pool is free again: a run after it is admitted on the next tick
    after = k8s.e.submit("research", "gpu_job", request("online-training", 8, project="vision"))
    assert k8s.e.tick().admitted == [after]


def test_a_preempted_victims_objects_are_deleted_beside_its_termination(k8s_dra: Cluster) -> None:
    e = k8s_dra.e
    in_quota = e.submit("research", "gpu_job", request("online-training", 8, project="llm"))
    borrowed = e.submit("product", "gpu_job", request("offline-training", 8, project="serving"))
    assert e.tick().admitted == [in_quota, borrowed]
    victim = k8s_dra.allocation(borrowed)
    template = f"ResourceClaimTemplate/{claim_template_name(victim)}"
    assert template in k8s_dra.api.store
    mark = len(k8s_dra.api.calls)

    serving = e.submit("research", "gpu_job", request("inference", 8, project="vision", gpu_model="H100-SXM"))
    report = e.tick()

    assert report.preempted == [borrowed]
    assert report.admitted == [serving]
    deletes = [kw["name"] for m, kw in k8s_dra.api.calls[mark:] if m.startswith("delete_")]
    assert deletes == [claim_template_name(victim)]
    assert (e.tag(borrowed, rt.PREEMPTED_BY) or "").startswith(f"preempted by run {serving}")


def test_the_tick_pins_gated_gang_pods_each_tick_and_a_release_deletes_the_gang(k8s: Cluster) -> None:
    assert k8s.e.tick().admitted == []
    assert k8s.api.methods() == ["list_namespaced_pod"]  # the reconcile step, with nothing to pin

    gang = k8s.e.submit("research", "gpu_job", GANG_TAGS)
    k8s.e.tick()
    objects = gang_objects(k8s.allocation(gang), k8s.e.gpu_pool.pool(), k8s.settings)
    # the Job's controller creates its pods a moment later, behind the scheduling gate
    k8s.api.pods = [pod_from(objects.job.spec.template, f"{objects.job.metadata.name}-{i}", i) for i in (0, 1)]
    assert all(p.spec.scheduling_gates[0].name == GATE for p in k8s.api.pods)
    mark = len(k8s.api.calls)

    k8s.e.tick()

    pinned = {kw["name"]: kw["body"] for m, kw in k8s.api.calls[mark:] if m == "patch_namespaced_pod"}
    assert sorted(pinned) == [p.metadata.name for p in k8s.api.pods]
    nodes = objects.job.spec.template.metadata.annotations[POD_NODES].split(",")
    assert sorted(nodes) == ["h100-00", "h100-01"]
    for index, pod in enumerate(k8s.api.pods):
        assert nodes[index] in str(pinned[pod.metadata.name]), pinned[pod.metadata.name]

    k8s.e.dequeue()
    k8s.e.wait_for("the gang's run worker to end", lambda: k8s.e.status(gang) == DagsterRunStatus.SUCCESS)
    mark = len(k8s.api.calls)
    assert k8s.e.release_sensors(gang) == ["xirang_release_on_success"]
    assert k8s.since(mark) == ["delete_namespaced_job", "delete_namespaced_service"]
    assert k8s.e.held() == set()


def test_without_a_usable_cluster_the_tick_skips_with_the_fix_and_admits_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "xirang-k8s.yaml"
    bad.write_text("gpu_request: cuda\n", encoding="utf-8")
    monkeypatch.setenv("XIRANG_K8S_SETTINGS", str(bad))
    monkeypatch.setattr(launcher_module, "_cluster", None)
    with engine(tmp_path, "sqlite", K8S_PLATFORM) as e:
        gang = e.submit("research", "gpu_job", GANG_TAGS)
        tick = build_scheduling_tick()
        with build_sensor_context(instance=e.instance, resources={"gpu_pool": e.gpu_pool}) as context:
            skipped = tick(context)

        assert skipped.skip_message.startswith(f"tick skipped: launcher k8s: {bad}: gpu_request:")
        assert e.tag(gang, rt.GATE) == "queued"
        assert e.held() == set()
