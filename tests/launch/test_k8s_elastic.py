"""An elastic training run on Kubernetes (DESIGN.md section 11): the objects of every size it may take
validate strictly, mount the same checkpoint directory, and a resize replaces the gang's Indexed Job
with one of the new size."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.launch.fake_k8s import RecordingApi
from tests.launch.k8s_builders import alloc, launch_pool
from tests.launch.k8s_checks import validate_strictly, versions_for
from xirang_platform.launch.k8s import is_gang, run_objects
from xirang_platform.launch.k8s_elastic import CHECKPOINT_ENV, CHECKPOINT_MOUNT, lineage_path
from xirang_platform.launch.k8s_gang import gang_objects
from xirang_platform.launch.k8s_pod import manifest
from xirang_platform.launch.k8s_run_worker import run_worker_job
from xirang_platform.launch.k8s_settings import GpuRequest, K8sSettings
from xirang_platform.launch.k8s_submit import K8sSubmitter
from xirang_platform.scheduling.model import Allocation, GpuRange, Tier

POOL = launch_pool()
SETTINGS = K8sSettings(namespace="ml", checkpoint_claim="team-checkpoints")
SUBMITTED = 1_765_000_000.25  # the lineage's original submit time: a resumption keeps it
RANGE = GpuRange(4, 24, 4)


def sized(run_id: str, *nodes: tuple[str, int]) -> Allocation:
    """Elastic run `run_id` (4..24 GPUs in steps of 4) on the first GPUs of each (node, count)."""
    builder = alloc(run_id).tier(Tier.ONLINE_TRAINING)
    for node, count in nodes:
        builder = builder.gpus(node, *range(count))
    a = builder.build()
    return replace(a, request=replace(a.request, submit_time=SUBMITTED, elastic=RANGE))


SIZES = [
    pytest.param(sized("r4", ("h100-1", 4)), 1, id="4 GPUs on one node: the run worker holds them"),
    pytest.param(sized("r8", ("h100-1", 8)), 1, id="8 GPUs on one node"),
    pytest.param(sized("r12", ("h100-0", 8), ("h100-2", 4)), 3, id="12 GPUs, 8 + 4: three pods of 4"),
    pytest.param(sized("r16", ("h100-0", 8), ("h100-2", 8)), 2, id="16 GPUs, 8 + 8: a pod per node"),
    pytest.param(sized("r24", ("h100-0", 8), ("h100-1", 8), ("h100-2", 8)), 3, id="24 GPUs over three nodes"),
]


def pod_spec_of(a: Allocation, settings: K8sSettings = SETTINGS) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pod spec that holds `a`'s GPUs (its gang's, else its run worker's) and every object made for it."""
    if is_gang(a):
        gang = gang_objects(a, POOL, settings)
        docs = [manifest(o) for o in gang.objects()]
        return manifest(gang.job)["spec"]["template"]["spec"], docs
    job = manifest(run_worker_job(a, POOL, settings, run_id=a.id))
    return job["spec"]["template"]["spec"], [job, *(manifest(o) for o in run_objects(a, POOL, settings))]


@pytest.mark.parametrize(("allocation", "pods"), SIZES)
@pytest.mark.parametrize("settings", [SETTINGS, replace(SETTINGS, gpu_request=GpuRequest.DRA)], ids=["plugin", "dra"])
def test_every_size_validates_and_mounts_the_lineages_checkpoints(
    allocation: Allocation, pods: int, settings: K8sSettings
) -> None:
    spec, docs = pod_spec_of(allocation, settings)
    for doc in docs:
        validate_strictly(doc, versions_for(doc))
    [volume] = spec["volumes"]
    assert volume["persistentVolumeClaim"] == {"claimName": "team-checkpoints"}
    [container] = [c for c in spec["containers"] if any(m["name"] == volume["name"] for m in c.get("volumeMounts", []))]
    [mount] = container["volumeMounts"]
    assert (mount["mountPath"], mount["subPath"]) == (CHECKPOINT_MOUNT, f"vision/detector/{round(SUBMITTED * 1000)}")
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[CHECKPOINT_ENV] == CHECKPOINT_MOUNT
    if is_gang(allocation):
        job = next(d for d in docs if d["kind"] == "Job")
        assert (job["spec"]["completions"], env["WORLD_SIZE"]) == (pods, str(pods))


def test_a_fixed_run_mounts_no_checkpoint_volume() -> None:
    fixed = alloc("fixed").tier(Tier.ONLINE_TRAINING).gpus("h100-0", *range(8)).gpus("h100-2", *range(8)).build()
    spec, _ = pod_spec_of(fixed)
    assert "volumes" not in spec


def test_a_resize_replaces_the_gangs_job_with_one_of_the_new_size_over_the_same_checkpoints() -> None:
    # The run at 16 GPUs is resized to 24: the tick stops the old allocation's objects with its run,
    # and the resumption (a new run id, the same lineage) launches a Job of the new size.
    old = sized("run-a", ("h100-0", 8), ("h100-2", 8))
    new = sized("run-b", ("h100-0", 8), ("h100-1", 8), ("h100-2", 8))
    api = RecordingApi()
    launcher = K8sSubmitter("ml", api, api, api, api, api, retries=1, backoff_s=0.0, sleep=lambda _: None)
    launcher.launch(old, POOL, SETTINGS)
    launcher.stop(old, POOL, SETTINGS)
    launcher.launch(new, POOL, SETTINGS)

    created = [kw["body"] for m, kw in api.calls if m == "create_namespaced_job"]
    deleted = [kw["name"] for m, kw in api.calls if m == "delete_namespaced_job"]
    assert [j.spec.completions for j in created] == [2, 3]
    assert deleted == [created[0].metadata.name]
    assert created[1].metadata.name != created[0].metadata.name
    mounts = [j.spec.template.spec.containers[0].volume_mounts[0].sub_path for j in created]
    assert mounts == [lineage_path(old.request)] * 2
