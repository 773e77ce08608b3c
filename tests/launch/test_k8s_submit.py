"""The launcher's calls against a recording fake of the kubernetes API (as dagster-k8s tests itself):
create, 409 retried, refusals turned into messages naming cause and fix, delete on preemption,
gated pods pinned."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.launch.fake_k8s import RecordingApi, api_error, pod_from
from tests.launch.k8s_builders import alloc, launch_pool
from xirang_platform.launch.k8s import run_objects
from xirang_platform.launch.k8s_gang import gang_objects
from xirang_platform.launch.k8s_pod import ALLOCATION, GATE, MANAGED_BY, manifest
from xirang_platform.launch.k8s_serve import InferenceService, serve_objects
from xirang_platform.launch.k8s_settings import GpuRequest, K8sSettings
from xirang_platform.launch.k8s_submit import K8sSubmitter, LaunchRefused
from xirang_platform.scheduling.model import Tier

POOL = launch_pool()
SETTINGS = K8sSettings(namespace="ml")
GANG = alloc("gang-16").tier(Tier.ONLINE_TRAINING).gpus("h100-0", *range(8)).gpus("h100-2", *range(8)).build()
REPLICAS = tuple(
    alloc(f"chat-{i}").tier(Tier.INFERENCE).owner("nlp", "chat").fraction(node, gpu=0, milli=500).build()
    for i, node in enumerate(["l40s-1", "l40s-0"])
)


def launcher(api: RecordingApi) -> tuple[K8sSubmitter, list[float]]:
    slept: list[float] = []
    return K8sSubmitter("ml", api, api, api, api, api, retries=3, backoff_s=0.5, sleep=slept.append), slept


def pod(name: str, labels: dict[str, str], gated: bool, annotations: dict[str, str] | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations or {}),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="c")],
            scheduling_gates=[client.V1PodSchedulingGate(name=GATE)] if gated else None,
        ),
    )


def test_create_sends_each_object_to_its_api_in_order():
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    launcher(api)[0].create_all(gang.objects())
    assert api.methods() == ["create_namespaced_service", "create_namespaced_job"]
    assert [kw["namespace"] for _, kw in api.calls] == ["ml", "ml"]
    assert api.calls[1][1]["body"] is gang.job


def test_dra_claim_template_goes_to_the_resource_api():
    api = RecordingApi()
    (template,) = run_objects(alloc("w").gpus("h100-1", 0).build(), POOL, K8sSettings(gpu_request=GpuRequest.DRA))
    launcher(api)[0].create(template)
    assert api.methods() == ["create_namespaced_resource_claim_template"]


def test_a_name_still_being_deleted_is_retried_with_backoff_until_it_clears():
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    terminating = client.V1Job(
        metadata=client.V1ObjectMeta(
            name=gang.job.metadata.name, labels=gang.job.metadata.labels, deletion_timestamp="2026-11-30T16:00:00Z"
        )
    )
    conflict = api_error(409, "Conflict", f'jobs.batch "{gang.job.metadata.name}" already exists')
    api.script("create_namespaced_job", conflict, conflict)
    api.script("read_namespaced_job", terminating, terminating)
    run, slept = launcher(api)
    assert run.create(gang.job) is gang.job
    assert api.methods().count("create_namespaced_job") == 3
    assert slept == [0.5, 1.0]


def test_a_name_freed_between_the_conflict_and_the_read_is_created_on_retry():
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    api.script("create_namespaced_job", api_error(409, "Conflict", "already exists"))
    api.script("read_namespaced_job", api_error(404, "Not Found", "not found"))
    run, slept = launcher(api)
    assert run.create(gang.job) is gang.job
    assert api.methods() == ["create_namespaced_job", "read_namespaced_job", "create_namespaced_job"]
    assert slept == [0.5]


def test_an_existing_object_of_the_same_allocation_counts_as_created():
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    existing = client.V1Job(metadata=client.V1ObjectMeta(name=gang.job.metadata.name, labels=gang.job.metadata.labels))
    api.script("create_namespaced_job", api_error(409, "Conflict", "already exists"))
    api.script("read_namespaced_job", existing)
    run, slept = launcher(api)
    assert run.create(gang.job) is existing
    assert slept == []


def test_a_conflict_that_never_clears_is_refused_naming_it():
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    other = client.V1Job(
        metadata=client.V1ObjectMeta(name=gang.job.metadata.name, labels={"xirang.io/allocation": "x"})
    )
    api.script("create_namespaced_job", *[api_error(409, "Conflict", "already exists")] * 4)
    api.script("read_namespaced_job", *[other] * 4)
    run, slept = launcher(api)
    with pytest.raises(LaunchRefused, match="another object holds the name") as info:
        run.create(gang.job)
    assert info.value.cause == "conflict"
    assert slept == [0.5, 1.0, 2.0]


@pytest.mark.parametrize(
    ("error", "cause", "says"),
    [
        pytest.param(
            api_error(
                403,
                "Forbidden",
                'jobs.batch is forbidden: User "system:serviceaccount:ml:dagster" cannot create '
                'resource "jobs" in API group "batch" in the namespace "ml"',
            ),
            "rbac",
            "needs `create` on jobs in ml: apply deploy/rbac.yaml",
            id="rbac",
        ),
        pytest.param(
            api_error(
                403,
                "Forbidden",
                'jobs.batch "x" is forbidden: exceeded quota: gpu-quota, requested: '
                "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=60, limited: requests.nvidia.com/gpu=64",
            ),
            "quota",
            "ResourceQuota refuses it",
            id="quota",
        ),
        pytest.param(
            api_error(
                403, "Forbidden", 'pods "x" is forbidden: no PriorityClass with name xirang-online-training was found'
            ),
            "priority-class",
            "apply deploy/priority-classes.yaml",
            id="missing-priority-class",
        ),
        pytest.param(
            api_error(
                422,
                "Unprocessable Entity",
                'Job.batch "x" is invalid',
                [{"field": "spec.template.spec.containers[0].resources.limits", "message": "must be an integer"}],
            ),
            "invalid",
            "spec.template.spec.containers[0].resources.limits: must be an integer",
            id="invalid",
        ),
        pytest.param(
            api_error(404, "Not Found", 'namespaces "ml" not found'),
            "namespace",
            "deploy/namespace.yaml",
            id="namespace",
        ),
    ],
)
def test_refusals_name_the_cause_and_the_fix(error, cause, says):
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    api.script("create_namespaced_job", error)
    run, slept = launcher(api)
    with pytest.raises(LaunchRefused) as info:
        run.create(gang.job)
    assert info.value.cause == cause
    assert says in str(info.value)
    assert f"create Job ml/{gang.job.metadata.name}" in str(info.value)
    assert slept == []  # a refusal is not retried


def test_missing_priority_classes_are_found_before_any_launch():
    api = RecordingApi()
    api.script(
        "read_priority_class",
        client.V1PriorityClass(value=1),
        api_error(404, "Not Found", "not found"),
        client.V1PriorityClass(value=1),
        api_error(404, "Not Found", "not found"),
    )
    with pytest.raises(LaunchRefused, match=r"missing: .*\(inference\).*kubectl apply -f deploy/priority-classes.yaml"):
        launcher(api)[0].check_priority_classes(SETTINGS)
    assert api.methods() == ["read_priority_class"] * 4


def test_preemption_deletes_the_gang_last_created_first_with_its_pods():
    api = RecordingApi()
    gang = gang_objects(GANG, POOL, SETTINGS)
    api.script("delete_namespaced_service", api_error(404, "Not Found", "not found"))
    assert launcher(api)[0].delete_all(gang.objects()) == [True, False]
    assert api.methods() == ["delete_namespaced_job", "delete_namespaced_service"]
    assert api.calls[0][1]["name"] == gang.job.metadata.name
    assert api.calls[0][1]["body"].propagation_policy == "Foreground"


def test_a_victim_past_its_grace_has_its_run_and_gang_pods_killed_at_once():
    # A run pod's terminationGracePeriodSeconds is the longest grace (P1's 120 s); a P0's victim
    # gets 15 s: at its end the tick deletes the victim's pods with no further grace.
    run_pod = pod("run-abc-x", {"dagster/run-id": "abc"}, gated=False)
    gang_pod = pod("gang-0", {**MANAGED_BY, ALLOCATION: "abc"}, gated=False)
    other = pod("run-def-y", {"dagster/run-id": "def"}, gated=False)
    api = RecordingApi(pods=[run_pod, gang_pod, other])
    api.script("delete_namespaced_pod", client.V1Status(status="Success"), api_error(404, "Not Found", "gone"))
    assert launcher(api)[0].kill_run_pods("abc") == ["gang-0"]  # the run pod was gone already
    deletes = [kw for m, kw in api.calls if m == "delete_namespaced_pod"]
    assert [d["name"] for d in deletes] == ["gang-0", "run-abc-x"]  # by name; never another run's
    assert {d["body"].grace_period_seconds for d in deletes} == {0}


def test_gated_gang_pods_are_pinned_to_the_node_of_their_index():
    gang = gang_objects(GANG, POOL, SETTINGS)
    name = gang.job.metadata.name
    api = RecordingApi(pods=[pod_from(gang.job.spec.template, f"{name}-{i}-x", index=i) for i in (1, 0)])
    assert launcher(api)[0].pin_gated_pods() == {f"{name}-0-x": "h100-0", f"{name}-1-x": "h100-2"}
    assert api.calls[0] == (
        "list_namespaced_pod",
        {"namespace": "ml", "label_selector": "app.kubernetes.io/managed-by=xirang"},
    )
    patches = {kw["name"]: kw["body"] for m, kw in api.calls if m == "patch_namespaced_pod"}
    assert patches[f"{name}-1-x"][0]["value"] == {"key": "metadata.name", "operator": "In", "values": ["h100-2"]}
    assert patches[f"{name}-0-x"][-1] == {"op": "remove", "path": "/spec/schedulingGates"}


def _service_pods(service: InferenceService, bound: dict[str, str], gated: list[str]) -> tuple[object, list]:
    """The service's Deployment, its running pods (name -> replica id) and gated new pods."""
    deployment, _ = serve_objects(service, POOL, SETTINGS)
    pods = []
    for name, replica in bound.items():
        running = pod_from(deployment.spec.template, name)
        running.metadata.annotations["xirang.io/allocation"] = replica
        running.spec = client.V1PodSpec(containers=running.spec.containers)  # gate lifted
        pods.append(running)
    pods += [pod_from(deployment.spec.template, name) for name in gated]
    return deployment, pods


def test_scaling_patches_replicas_then_binds_the_new_pod_to_the_new_replica():
    service = InferenceService("chat", REPLICAS)
    deployment, pods = _service_pods(InferenceService("chat", REPLICAS[:1]), {"chat-a": "chat-0"}, ["chat-b"])
    api = RecordingApi(pods=pods)
    run, _ = launcher(api)
    run.create(deployment)
    assert run.scale(service) == {"chat-b": "l40s-0"}
    assert api.methods()[1:] == [
        "patch_namespaced_deployment",
        "list_namespaced_pod",
        "read_namespaced_deployment",
        "patch_namespaced_pod",
    ]
    assert api.calls[1][1]["body"]["spec"] == {"replicas": 2}
    # The client would send a dict as a JSON patch (its default content type): the launcher says which.
    assert api.calls[1][1]["_content_type"] == "application/strategic-merge-patch+json"
    assert api.calls[-1][1]["_content_type"] == "application/json-patch+json"
    pin = api.calls[-1][1]["body"]
    assert {"op": "add", "path": "/metadata/annotations/xirang.io~1allocation", "value": "chat-1"} in pin
    assert pin[-2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["l40s-0"]}]}]
    }


def test_a_replica_already_bound_is_not_bound_twice():
    deployment, pods = _service_pods(
        InferenceService("chat", REPLICAS), {"chat-a": "chat-0", "chat-b": "chat-1"}, ["chat-c"]
    )
    api = RecordingApi(pods=pods)
    run, _ = launcher(api)
    run.create(deployment)
    assert run.pin_gated_pods() == {}  # a surplus pod (the ReplicaSet's, mid scale-down) stays gated
    assert "patch_namespaced_pod" not in api.methods()


def test_scale_down_marks_the_leaving_replica_to_go_first():
    service = InferenceService("chat", REPLICAS[:1])
    _, pods = _service_pods(InferenceService("chat", REPLICAS), {"chat-a": "chat-0", "chat-b": "chat-1"}, [])
    api = RecordingApi(pods=pods)
    launcher(api)[0].scale(service, leaving=["chat-1"])
    (cost,) = [kw for m, kw in api.calls if m == "patch_namespaced_pod"]
    assert cost["name"] == "chat-b"
    assert cost["body"] == {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-1000"}}}
    assert api.calls[0] == ("list_namespaced_pod", {"namespace": "ml", "label_selector": "xirang.io/service=chat"})


def test_rendered_service_objects_are_what_the_launcher_creates():
    api = RecordingApi()
    objects = serve_objects(InferenceService("chat", REPLICAS), POOL, SETTINGS)
    launcher(api)[0].create_all(objects)
    assert api.methods() == ["create_namespaced_deployment", "create_namespaced_service"]
    assert manifest(api.store[f"Deployment/{objects[0].metadata.name}"])["spec"]["replicas"] == 2


def test_launching_a_gang_creates_its_service_and_indexed_job_and_stopping_deletes_them():
    api = RecordingApi()
    run, _ = launcher(api)
    created = run.launch(GANG, POOL, SETTINGS)
    assert [o.kind for o in created] == ["Service", "Job"]
    assert api.methods() == ["create_namespaced_service", "create_namespaced_job", "list_namespaced_pod"]
    api.calls.clear()
    assert run.stop(GANG, POOL, SETTINGS) == [True, True]
    assert api.methods() == ["delete_namespaced_job", "delete_namespaced_service"]


def test_launching_a_single_node_run_in_dra_mode_creates_its_claim_template_only():
    api = RecordingApi()
    run, _ = launcher(api)
    whole = alloc("w").gpus("h100-1", 0, 1).build()
    assert [o.kind for o in run.launch(whole, POOL, K8sSettings(gpu_request=GpuRequest.DRA))] == [
        "ResourceClaimTemplate"
    ]
    assert run.launch(whole, POOL, SETTINGS) == []  # device-plugin mode: the tag is all it takes
