"""The preemption grace on the Kubernetes objects: every pod that does a run's work (the run worker
and a gang's pods) gets `terminationGracePeriodSeconds` = the longest grace a preemptor gives
(`PreemptionGrace.longest`), so the kubelet sends SIGTERM (the run's notice) and kills it only when
that grace has passed; validated against the Kubernetes schema with kubernetes-validate."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from dagster_k8s.job import DagsterK8sJobConfig, construct_dagster_k8s_job, get_user_defined_k8s_config

from tests.launch.k8s_builders import alloc, launch_pool
from tests.launch.k8s_checks import validate_strictly
from xirang_platform.control.notice import PreemptionGrace
from xirang_platform.launch.k8s import DAGSTER_K8S_CONFIG_TAG, dagster_k8s_config
from xirang_platform.launch.k8s_gang import gang_objects
from xirang_platform.launch.k8s_pod import manifest
from xirang_platform.launch.k8s_run_worker import run_worker_job
from xirang_platform.launch.k8s_settings import K8sSettings, K8sSettingsError, settings_from_mapping
from xirang_platform.scheduling.model import Tier

POOL = launch_pool()
WHOLE = alloc("train-4").tier(Tier.OFFLINE_TRAINING).gpus("h100-1", 0, 1, 2, 3).build()
GANG = alloc("gang-16").tier(Tier.OFFLINE_TRAINING).gpus("h100-0", *range(8)).gpus("h100-2", *range(8)).build()


def dagster_job(allocation, settings: K8sSettings, job_name: str) -> dict:
    """The run-worker Job dagster-k8s builds from the `dagster-k8s/config` tag the tick writes."""
    tags = {DAGSTER_K8S_CONFIG_TAG: dagster_k8s_config(allocation, POOL, settings)}
    return manifest(
        construct_dagster_k8s_job(
            DagsterK8sJobConfig(job_image=settings.image, service_account_name=settings.service_account),
            args=["dagster", "api", "execute_run"],
            job_name=job_name,
            user_defined_k8s_config=get_user_defined_k8s_config(tags),
            component="run_worker",
        )
    )


def pods(settings: K8sSettings) -> dict[str, dict]:
    """The pod templates of a run worker (ours and the one dagster-k8s builds from the tag), a gang's
    pods and a gang's run worker, each validated strictly."""
    docs = {
        "run worker (ours)": manifest(run_worker_job(WHOLE, POOL, settings, run_id="r1")),
        "run worker (dagster-k8s, from the tag)": dagster_job(WHOLE, settings, "dagster-run-r1"),
        "gang job": manifest(gang_objects(GANG, POOL, settings).job),
        "gang run worker (dagster-k8s, from the tag)": dagster_job(GANG, settings, "dagster-run-r2"),
    }
    for doc in docs.values():
        validate_strictly(doc)
    return {name: doc["spec"]["template"]["spec"] for name, doc in docs.items()}


@pytest.mark.parametrize(
    ("grace", "want_s"),
    [
        pytest.param(PreemptionGrace(), 120, id="the tier table's longest grace: 120 s (a P1 preemptor)"),
        pytest.param(PreemptionGrace((("P1", 300.0),)), 300, id="the platform config's longer grace"),
        pytest.param(PreemptionGrace((("P1", 7.5), ("P2", 7.5))), 15, id="a fraction of a second is rounded up"),
    ],
)
def test_every_pod_of_a_run_gets_the_longest_grace_as_its_termination_grace(grace: PreemptionGrace, want_s) -> None:
    settings = replace(K8sSettings(), termination_grace_s=grace.longest())
    assert {name: pod["terminationGracePeriodSeconds"] for name, pod in pods(settings).items()} == dict.fromkeys(
        pods(settings), want_s
    )


def test_the_grace_is_not_a_kubernetes_setting_but_the_platform_configs() -> None:
    with pytest.raises(K8sSettingsError) as err:
        settings_from_mapping({"termination_grace_s": 30}, "deploy/xirang-k8s.yaml")
    assert "termination_grace_s: is not a setting; set preemption_grace_s in xirang.yaml" in str(err.value)


def test_the_ticks_cluster_renders_the_platform_configs_grace() -> None:
    from xirang_platform.launch.k8s_cluster import K8sCluster

    cluster = K8sCluster(submitter=None, settings=K8sSettings()).with_grace(PreemptionGrace((("P1", 300.0),)).longest())
    tag = json.loads(cluster.k8s_config(WHOLE, POOL))
    assert tag["pod_spec_config"]["termination_grace_period_seconds"] == 300


@pytest.mark.parametrize(
    ("elapsed_s", "want_killed"),
    [
        pytest.param(16.0, True, id="a P0's victim still running past its 15 s grace has its pods killed"),
        pytest.param(14.0, False, id="inside its grace it keeps its pods"),
    ],
)
def test_on_kubernetes_the_victims_own_grace_ends_with_its_pods_killed(elapsed_s: float, want_killed: bool) -> None:
    from dagster import DagsterRunStatus, instance_for_test
    from kubernetes import client

    from sensors.notices import enforce_grace
    from tests.launch.fake_k8s import RecordingApi
    from xirang_platform.control import run_tags as rt
    from xirang_platform.control.notice import Notice
    from xirang_platform.dagster_compat import create_run_for_test
    from xirang_platform.launch.k8s_cluster import K8sCluster
    from xirang_platform.launch.k8s_submit import K8sSubmitter

    victim = "0b5c3d2e-7f41-4a8e-9c1d-2e6f8a9b0c1d"
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="run-victim", labels={"dagster/run-id": victim}))
    api = RecordingApi(pods=[pod])
    cluster = K8sCluster(K8sSubmitter("ml", api, api, api, api, api), K8sSettings())
    notice = Notice(by="replica", reason="priority", grace_s=15.0, at=1_000.0)
    with instance_for_test() as instance:
        run = create_run_for_test(
            instance, run_id=victim, status=DagsterRunStatus.CANCELING, tags={rt.NOTICE: notice.tag()}
        )
        killed = enforce_grace(instance, {victim: run}, 1_000.0 + elapsed_s, cluster)
        logs = [e.message for e in instance.all_logs(victim)]
    deletes = [kw for m, kw in api.calls if m == "delete_namespaced_pod"]
    assert (killed == [victim]) is want_killed
    assert [(d["name"], d["body"].grace_period_seconds) for d in deletes] == (
        [("run-victim", 0)] if want_killed else []
    )
    assert any("grace of 15 s ended" in m and "run-victim deleted" in m for m in logs) is want_killed
