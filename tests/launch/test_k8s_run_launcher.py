"""The tag through Dagster's real `K8sRunLauncher`: `launch_run` sends the Job it builds from our
`dagster-k8s/config` tag to the batch API (the recording fake, as dagster-k8s's own tests pass a fake
`k8s_client_batch_api`); that Job is the one we render, valid for Kubernetes 1.33 and 1.37, and
`terminate` (how a preempted run is stopped) deletes it."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster import instance_for_test
from dagster_k8s import K8sRunLauncher

from tests.launch.fake_k8s import RecordingApi
from tests.launch.k8s_builders import alloc, launch_pool
from tests.launch.k8s_checks import pod_facts, validate_strictly, versions_for
from xirang_platform.dagster_compat import LaunchRunContext, create_run_for_test
from xirang_platform.launch.k8s import DAGSTER_K8S_CONFIG_TAG, dagster_k8s_config
from xirang_platform.launch.k8s_pod import manifest
from xirang_platform.launch.k8s_run_worker import run_worker_job
from xirang_platform.launch.k8s_settings import FractionSharing, GpuRequest, K8sSettings
from xirang_platform.scheduling.model import Tier

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: fake, user: {token: fake}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
current-context: fake
"""
POOL = launch_pool()


@dg.op
def step() -> None:
    """Nothing: the run is launched, never executed."""


@dg.job
def train() -> None:
    step()


@pytest.fixture
def launched(tmp_path):
    """Launch one run carrying our tag through a real K8sRunLauncher; returns (api, launcher, run)."""
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)

    def launch(allocation, settings):
        api = RecordingApi()
        with instance_for_test() as instance:
            launcher = K8sRunLauncher(
                service_account_name=settings.service_account,
                instance_config_map="dagster-instance",
                dagster_home="/opt/dagster/dagster_home",
                job_namespace=settings.namespace,
                job_image=settings.image,
                load_incluster_config=False,
                kubeconfig_file=str(tmp_path / "kubeconfig"),
                k8s_client_batch_api=api,
                k8s_client_core_api=api,
            )
            launcher.register_instance(instance)
            run = create_run_for_test(
                instance,
                job_name="train",
                tags={DAGSTER_K8S_CONFIG_TAG: dagster_k8s_config(allocation, POOL, settings)},
                job_code_origin=dg.reconstructable(train).get_python_origin(),
            )
            launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
            created = list(api.calls)
            launcher.terminate(run.run_id)
        return created, api.calls[len(created) :], run

    return launch


@pytest.mark.parametrize(
    ("allocation", "settings"),
    [
        pytest.param(
            alloc("whole").tier(Tier.ONLINE_TRAINING).gpus("h100-1", 0, 1, 2, 3).build(), K8sSettings(), id="whole-gpus"
        ),
        pytest.param(
            alloc("mig").fraction("a100-mig", gpu=1, milli=250, asked=142).build(), K8sSettings(), id="mig-slice"
        ),
        pytest.param(
            alloc("frac").fraction("l40s-0", gpu=0, milli=250).build(),
            K8sSettings(fraction_sharing=FractionSharing.HAMI),
            id="hami-fraction",
        ),
        pytest.param(
            alloc("dra").gpus("h100-2", 0, 1).build(), K8sSettings(gpu_request=GpuRequest.DRA), id="dra-claim"
        ),
        pytest.param(
            alloc("gang").gpus("h100-0", *range(8)).gpus("h100-2", *range(8)).build(),
            K8sSettings(),
            id="gang-run-worker",
        ),
    ],
)
def test_k8s_run_launcher_creates_the_job_we_render_and_deletes_it_on_terminate(launched, allocation, settings):
    created, after, run = launched(allocation, settings)
    assert [m for m, _ in created] == ["create_namespaced_job"]
    kwargs = created[0][1]
    assert kwargs["namespace"] == settings.namespace
    theirs = manifest(kwargs["body"])
    validate_strictly(theirs, versions_for(theirs))
    ours = manifest(run_worker_job(allocation, POOL, settings, run_id=run.run_id, job_name="train"))
    assert theirs["metadata"]["name"] == ours["metadata"]["name"] == f"dagster-run-{run.run_id}"
    their_pod, our_pod = theirs["spec"]["template"], ours["spec"]["template"]
    assert pod_facts(their_pod["spec"]) == pod_facts(our_pod["spec"])
    assert (their_pod["spec"]["containers"][0].get("resources") or {}) == (
        our_pod["spec"]["containers"][0].get("resources") or {}
    )
    assert their_pod["metadata"]["annotations"] == our_pod["metadata"]["annotations"]
    assert {k: v for k, v in our_pod["metadata"]["labels"].items() if k.startswith("xirang.io/")}.items() <= their_pod[
        "metadata"
    ]["labels"].items()
    assert ("delete_namespaced_job", f"dagster-run-{run.run_id}") in [(m, kw.get("name")) for m, kw in after]
