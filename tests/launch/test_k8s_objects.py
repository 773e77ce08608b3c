"""Allocations as Kubernetes objects: the placement fields each case gets, the tag Dagster reads,
and refusals of what cannot be expressed."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from tests.launch.k8s_builders import alloc, launch_pool
from tests.launch.k8s_checks import pod_facts, validate_strictly, versions_for
from xirang_platform.launch.k8s import (
    DAGSTER_K8S_CONFIG_TAG,
    dagster_k8s_config,
    dagster_k8s_config_dict,
    run_objects,
)
from xirang_platform.launch.k8s_gang import gang_objects, pin_plan
from xirang_platform.launch.k8s_gpu import LaunchError
from xirang_platform.launch.k8s_pod import Workload, manifest
from xirang_platform.launch.k8s_run_worker import run_worker_job
from xirang_platform.launch.k8s_serve import InferenceService, replica_pin_patch, scale_patch, serve_objects
from xirang_platform.launch.k8s_settings import FractionSharing, GpuRequest, K8sSettings
from xirang_platform.scheduling.model import Tier
from xirang_platform.serving.replica import DRAIN_GRACE_S, DRAIN_TIMEOUT_S

POOL = launch_pool()
PLUGIN = K8sSettings()
HAMI = K8sSettings(fraction_sharing=FractionSharing.HAMI)
DRA = K8sSettings(gpu_request=GpuRequest.DRA)

WHOLE = alloc("train-4").tier(Tier.ONLINE_TRAINING).gpus("h100-1", 0, 1, 2, 3).build()
MIG = alloc("mig-1g").fraction("a100-mig", gpu=2, milli=250, asked=142, memory=9856).build()
MIG_SINGLE = alloc("mig-single").fraction("a100-single", gpu=0, milli=250, asked=142).build()
FRACTION = alloc("nb-quarter").fraction("l40s-0", gpu=1, milli=250).build()
GANG_EVEN = alloc("gang-16").tier(Tier.ONLINE_TRAINING).gpus("h100-0", *range(8)).gpus("h100-2", *range(8)).build()
GANG_UNEVEN = alloc("gang-12").gpus("h100-0", *range(8)).gpus("h100-2", 0, 1, 2, 3).build()
REPLICAS = tuple(
    alloc(f"chat-{i}").tier(Tier.INFERENCE).owner("nlp", "chat").fraction(node, gpu=g, milli=500).build()
    for i, (node, g) in enumerate([("l40s-1", 0), ("l40s-1", 0), ("l40s-0", 0)])
)
SERVICE = InferenceService("chat", REPLICAS)


def run_pod(allocation, settings=PLUGIN) -> dict[str, Any]:
    return manifest(run_worker_job(allocation, POOL, settings, run_id="r1"))["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("allocation", "settings", "want"),
    [
        pytest.param(
            WHOLE,
            PLUGIN,
            {"gpu": {"nvidia.com/gpu": "4"}, "nodes": ["h100-1"], "priority": "xirang-online-training"},
            id="whole-gpus-are-nvidia-gpu-limits-on-their-node",
        ),
        pytest.param(
            MIG,
            PLUGIN,
            {"gpu": {"nvidia.com/mig-1g.10gb": "1"}, "nodes": ["a100-mig"], "priority": "xirang-offline-training"},
            id="mig-slice-is-the-smallest-offered-profile-that-fits",
        ),
        pytest.param(
            MIG_SINGLE,
            PLUGIN,
            {"gpu": {"nvidia.com/gpu": "1"}, "nodes": ["a100-single"], "priority": "xirang-offline-training"},
            id="mig-single-strategy-devices-are-nvidia-gpu",
        ),
        pytest.param(
            FRACTION,
            PLUGIN,
            {"gpu": {"nvidia.com/gpu": "1"}, "nodes": ["l40s-0"], "priority": "xirang-offline-training"},
            id="fraction-is-one-time-sliced-replica",
        ),
        pytest.param(
            FRACTION,
            HAMI,
            {
                "gpu": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "11517", "nvidia.com/gpucores": "25"},
                "nodes": ["l40s-0"],
                "priority": "xirang-offline-training",
            },
            id="fraction-under-hami-limits-memory-and-cores-to-its-share",
        ),
        pytest.param(
            WHOLE,
            DRA,
            {"gpu": {}, "nodes": ["h100-1"], "priority": "xirang-online-training", "claims": ["xirang-gpus-train-4"]},
            id="whole-gpus-under-dra-are-a-claim",
        ),
    ],
)
def test_single_node_placement_fields(allocation, settings, want):
    facts = pod_facts(run_pod(allocation, settings))
    assert {k: facts[k] for k in want} == want
    assert facts["tolerates_gpu"]
    assert not facts["gated"]


def test_multi_node_gang_is_an_indexed_job_with_one_pod_per_node_pinned_by_index():
    gang = gang_objects(GANG_EVEN, POOL, PLUGIN)
    job = manifest(gang.job)
    facts = pod_facts(job["spec"]["template"]["spec"])
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 2, 2)
    assert facts == {
        "gpu": {"nvidia.com/gpu": "8"},
        "nodes": ["h100-0", "h100-2"],
        "tolerates_gpu": True,
        "priority": "xirang-online-training",
        "claims": [],
        "gated": True,
    }
    assert gang.pod_nodes == ("h100-0", "h100-2")
    pins = {i: patch[-2]["value"]["values"] for i, patch in pin_plan(gang).items()}
    assert pins == {0: ["h100-0"], 1: ["h100-2"]}
    env = {
        e["name"]: e.get("value", e.get("valueFrom")) for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    name = gang.job.metadata.name
    assert env["MASTER_ADDR"] == f"{name}-0.{name}"
    assert (env["WORLD_SIZE"], env["NPROC_PER_NODE"]) == ("2", "8")
    assert env["RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    service = manifest(gang.service)
    assert service["spec"]["clusterIP"] == "None"
    assert job["spec"]["template"]["spec"]["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()


def test_uneven_gang_is_cut_into_equal_pods_on_the_nodes_that_hold_them():
    gang = gang_objects(GANG_UNEVEN, POOL, PLUGIN)
    assert gang.pod_nodes == ("h100-0", "h100-0", "h100-2")
    assert gang.job.spec.completions == 3
    assert gang.job.spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"


def test_gang_run_worker_carries_labels_and_priority_but_not_the_gpus():
    tag = dagster_k8s_config_dict(GANG_EVEN, POOL, PLUGIN)
    assert "container_config" not in tag
    assert tag["pod_spec_config"] == {
        "priority_class_name": "xirang-online-training",
        "termination_grace_period_seconds": 120,  # the longest preemption grace: the notice reaches the run worker
    }
    assert (
        tag["job_metadata"]["annotations"]["xirang.io/gang"] == gang_objects(GANG_EVEN, POOL, PLUGIN).job.metadata.name
    )


def test_inference_replicas_share_one_template_and_each_is_pinned_to_its_units():
    deployment, service = serve_objects(SERVICE, POOL, PLUGIN)
    spec = manifest(deployment)["spec"]
    facts = pod_facts(spec["template"]["spec"])
    assert spec["replicas"] == 3
    assert facts == {
        "gpu": {"nvidia.com/gpu": "1"},
        "nodes": [],
        "tolerates_gpu": True,
        "priority": "xirang-inference",
        "claims": [],
        "gated": True,
    }
    assert manifest(service)["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert json.loads(manifest(deployment)["metadata"]["annotations"]["xirang.io/replicas"]) == {
        "chat-0": "l40s-1",
        "chat-1": "l40s-1",
        "chat-2": "l40s-0",
    }
    assert spec["template"]["metadata"]["annotations"]["xirang.io/deployment"] == deployment.metadata.name
    pins = [replica_pin_patch(r.id, r.placement.nodes[0]) for r in REPLICAS]
    assert [
        p[-2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
            "matchFields"
        ][0]["values"]
        for p in pins
    ] == [["l40s-1"], ["l40s-1"], ["l40s-0"]]
    assert pins[2][-1] == {"op": "remove", "path": "/spec/schedulingGates"}
    assert {"op": "add", "path": "/metadata/labels/xirang.io~1allocation", "value": "chat-2"} in pins[2]


def test_a_replica_pod_is_ready_when_its_server_answers_ready_on_the_serving_port():
    deployment, service = serve_objects(SERVICE, POOL, PLUGIN, Workload(args=("serve", "--port", "9100"), port=9100))
    pod = manifest(deployment)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["ports"] == [{"name": "http", "containerPort": 9100}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert manifest(service)["spec"]["ports"][0]["targetPort"] == 9100
    assert pod["terminationGracePeriodSeconds"] > DRAIN_TIMEOUT_S + DRAIN_GRACE_S


def test_scaling_patches_only_the_replica_count():
    smaller = InferenceService("chat", REPLICAS[:2])
    before, _ = serve_objects(smaller, POOL, PLUGIN)
    after, _ = serve_objects(SERVICE, POOL, PLUGIN)
    assert manifest(before)["spec"]["template"] == manifest(after)["spec"]["template"]  # no rollout
    patch = scale_patch(SERVICE)
    assert patch == {
        "metadata": {
            "annotations": {"xirang.io/replicas": manifest(after)["metadata"]["annotations"]["xirang.io/replicas"]}
        },
        "spec": {"replicas": 3},
    }


def test_labels_and_annotations_name_tenant_project_tier_and_allocation():
    odd = alloc("Run/With Spaces:" + "x" * 70).owner("Team A", "p").fraction("l40s-0", gpu=0, milli=250).build()
    tag = dagster_k8s_config_dict(odd, POOL, PLUGIN)
    labels, notes = tag["pod_template_spec_metadata"]["labels"], tag["pod_template_spec_metadata"]["annotations"]
    assert (notes["xirang.io/allocation"], notes["xirang.io/tenant"]) == (odd.id, "Team A")
    assert re.fullmatch(r"Team-A-[0-9a-f]{8}", labels["xirang.io/tenant"])
    assert re.fullmatch(r"Run-With-Spaces-x+-[0-9a-f]{8}", labels["xirang.io/allocation"])
    assert len(labels["xirang.io/allocation"]) == 63
    assert json.loads(notes["xirang.io/placement"]) == {
        "gpus": [["l40s-0", 0, 250, 0]],
        "shares": [["l40s-0", 8000, 65536]],
    }
    validate_strictly(manifest(run_worker_job(odd, POOL, PLUGIN, run_id="r2")))


def test_hami_pins_the_gpu_by_uuid_when_the_pool_knows_it():
    tag = dagster_k8s_config_dict(FRACTION, POOL, HAMI)
    assert (
        tag["pod_template_spec_metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == POOL.node("l40s-0").gpu_uuids[1]
    )


@pytest.mark.parametrize(
    "allocation",
    [
        pytest.param(WHOLE, id="whole"),
        pytest.param(MIG, id="mig"),
        pytest.param(FRACTION, id="fraction"),
        pytest.param(GANG_EVEN, id="gang-run-worker"),
    ],
)
@pytest.mark.parametrize("settings", [pytest.param(PLUGIN, id="device-plugin"), pytest.param(HAMI, id="hami")])
def test_the_tag_makes_dagster_k8s_build_the_job_we_render(allocation, settings):
    tags = {DAGSTER_K8S_CONFIG_TAG: dagster_k8s_config(allocation, POOL, settings)}  # the tag the tick writes
    theirs = construct_dagster_k8s_job(
        DagsterK8sJobConfig(job_image=settings.image, service_account_name=settings.service_account),
        args=["dagster", "api", "execute_run"],
        job_name="dagster-run-r1",
        user_defined_k8s_config=get_user_defined_k8s_config(tags),
        component="run_worker",
    )
    theirs_doc, ours_doc = manifest(theirs), manifest(run_worker_job(allocation, POOL, settings, run_id="r1"))
    validate_strictly(theirs_doc)
    validate_strictly(ours_doc)
    their_pod, our_pod = theirs_doc["spec"]["template"], ours_doc["spec"]["template"]
    assert pod_facts(their_pod["spec"]) == pod_facts(our_pod["spec"])
    resources = [pod["spec"]["containers"][0].get("resources") or {} for pod in (their_pod, our_pod)]
    assert resources[0] == resources[1]
    assert their_pod["metadata"]["annotations"] == our_pod["metadata"]["annotations"]
    xirang = {k: v for k, v in our_pod["metadata"]["labels"].items() if k.startswith("xirang.io/")}
    assert xirang.items() <= their_pod["metadata"]["labels"].items()
    assert xirang.items() <= theirs_doc["metadata"]["labels"].items()


def test_dra_claims_come_from_a_template_with_cel_selectors_for_model_and_profile():
    (template,) = run_objects(WHOLE, POOL, DRA)
    doc = manifest(template)
    request = doc["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (request["deviceClassName"], request["count"]) == ("gpu.nvidia.com", 4)
    assert request["selectors"][0]["cel"]["expression"] == (
        "device.attributes['gpu.nvidia.com'].productName in ['NVIDIA H100 80GB HBM3']"
    )
    (mig_template,) = run_objects(MIG, POOL, DRA)
    mig = manifest(mig_template)["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert mig["deviceClassName"] == "mig.nvidia.com"
    assert mig["selectors"][0]["cel"]["expression"] == "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
    for obj in (doc, manifest(mig_template), manifest(run_worker_job(WHOLE, POOL, DRA, run_id="r1"))):
        validate_strictly(obj, versions_for(obj))
    assert run_objects(WHOLE, POOL, PLUGIN) == []


@pytest.mark.parametrize(
    ("allocation", "settings", "says"),
    [
        pytest.param(FRACTION, DRA, "cannot be claimed through DRA", id="dra-fraction-of-non-mig-gpu"),
        pytest.param(
            alloc("mig-big").fraction("a100-mig", gpu=0, milli=375, asked=300).build(),
            PLUGIN,
            "matches no MIG profile it offers (1g.10gb, 3g.40gb)",
            id="mig-asked-more-than-reserved",
        ),
        pytest.param(
            alloc("lost").gpus("gone-node", 0).build(), PLUGIN, "node gone-node is not in pool", id="unknown-node"
        ),
    ],
)
def test_what_cannot_be_expressed_is_refused_with_the_fix(allocation, settings, says):
    with pytest.raises(LaunchError, match="; "):
        dagster_k8s_config_dict(allocation, POOL, settings)
    with pytest.raises(LaunchError) as info:
        dagster_k8s_config_dict(allocation, POOL, settings)
    assert says in str(info.value)


def test_a_gang_over_different_gpu_requests_is_refused():
    mixed = alloc("mixed").gpus("h100-0", 0, 1).gpus("l40s-1", 0, 1).build()
    with pytest.raises(LaunchError, match="one Indexed Job has one pod shape"):
        gang_objects(mixed, POOL, DRA)


def test_replicas_asking_differently_are_refused():
    odd = InferenceService("mixed", (REPLICAS[0], replace(MIG, request=replace(MIG.request, tier=Tier.INFERENCE))))
    with pytest.raises(LaunchError, match="one Deployment has one pod shape"):
        serve_objects(odd, POOL, PLUGIN)


def test_the_tag_text_is_the_dict_as_compact_json_with_default_settings_when_none_are_given():
    text = dagster_k8s_config(MIG, POOL)
    assert json.loads(text) == dagster_k8s_config_dict(MIG, POOL, K8sSettings())
    assert text == dagster_k8s_config(MIG, POOL, K8sSettings())
