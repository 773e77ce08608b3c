"""Every file under deploy/ is checked by the loader of what it is: Kubernetes objects strictly by
kubernetes-validate against 1.33 and 1.37, dagster.yaml by Dagster's own instance schema and the
launcher's and coordinator's config schemas, the launcher settings by `load_settings`, the Helm
values against the instance they must produce (the chart's own values.schema.json is not available
offline, so its keys are checked against dagster.yaml, and its Kubernetes pieces as a Pod)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from dagster import Field, QueuedRunCoordinator, StringSource
from dagster_k8s import K8sRunLauncher

from tests.launch.fake_k8s import RecordingApi, pod_from
from tests.launch.k8s_builders import alloc, launch_pool
from tests.launch.k8s_checks import VERSIONS, validate_strictly
from xirang_platform.dagster_compat import dagster_instance_config, validate_config
from xirang_platform.launch.k8s_gang import gang_objects
from xirang_platform.launch.k8s_serve import InferenceService, serve_objects
from xirang_platform.launch.k8s_settings import K8sSettings, load_settings
from xirang_platform.launch.k8s_submit import _KINDS, K8sSubmitter
from xirang_platform.scheduling.model import Tier

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NOT_K8S = {"dagster.yaml", "helm-values.yaml", "xirang-k8s.yaml"}  # each checked by its own test below


def k8s_objects() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path.name not in NOT_K8S:
            out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def test_every_shipped_yaml_has_a_checker():
    names = {p.name for p in DEPLOY.glob("*.yaml")}
    assert names == NOT_K8S | {name for name, _ in k8s_objects()}
    assert {
        "namespace.yaml",
        "priority-classes.yaml",
        "rbac.yaml",
        "ledger-secret.example.yaml",
        "xirang-env.yaml",
    } <= names


@pytest.mark.parametrize(
    ("name", "doc"), [pytest.param(n, d, id=f"{n}:{d['kind']}/{d['metadata']['name']}") for n, d in k8s_objects()]
)
def test_kubernetes_objects_validate_strictly(name, doc):
    validate_strictly(doc, VERSIONS)
    assert doc["metadata"].get("namespace", "xirang") == K8sSettings().namespace


def test_one_priority_class_per_tier_none_of_which_lets_kubernetes_preempt():
    classes = {d["metadata"]["name"]: d for _, d in k8s_objects() if d["kind"] == "PriorityClass"}
    assert set(classes) == set(K8sSettings().priority_classes.values())
    assert {d["preemptionPolicy"] for d in classes.values()} == {"Never"}
    value = {tier: classes[K8sSettings().priority_class(tier)]["value"] for tier in Tier}
    assert (
        value[Tier.INFERENCE]
        > value[Tier.ONLINE_TRAINING]
        > value[Tier.OFFLINE_TRAINING]
        == value[Tier.BATCH_INFERENCE]
    )


def _launcher_calls() -> set[tuple[str, str]]:
    """(verb, resource) of every call the launcher makes in a create / pin / scale / delete round."""
    pool, settings = launch_pool(), K8sSettings()
    gang = gang_objects(alloc("g").gpus("h100-0", *range(8)).gpus("h100-2", *range(8)).build(), pool, settings)
    replica = alloc("r").tier(Tier.INFERENCE).fraction("l40s-1", gpu=0, milli=500).build()
    service = InferenceService("chat", (replica,))
    deployment, _ = objects = serve_objects(service, pool, settings)
    pods = [pod_from(gang.job.spec.template, "g-0", index=0), pod_from(deployment.spec.template, "chat-x")]
    api = RecordingApi(pods=pods)
    run = K8sSubmitter("xirang", api, api, api, api, api)
    run.create_all([*gang.objects(), *objects])
    run.pin_gated_pods()
    run.scale(service, leaving=["r"])
    run.delete_all(gang.objects())
    resources = {kind.plural: kind.resource for kind in _KINDS.values()}
    verbs = {"read": "get"}
    out = set()
    for method in api.methods():
        verb, _, rest = method.partition("_namespaced_")
        out.add((verbs.get(verb, verb), resources[rest]))
    return out


def test_the_launcher_role_allows_every_call_the_launcher_makes():
    (role,) = [d for _, d in k8s_objects() if d["kind"] == "Role"]
    allowed = {(verb, res) for rule in role["rules"] for verb in rule["verbs"] for res in rule["resources"]}
    calls = _launcher_calls()
    assert {
        ("create", "jobs"),
        ("patch", "pods"),
        ("list", "pods"),
        ("patch", "deployments"),
        ("delete", "jobs"),
    } <= calls
    assert calls <= allowed


def test_the_rbac_subjects_are_the_dagster_service_account_the_helm_values_name():
    values = yaml.safe_load((DEPLOY / "helm-values.yaml").read_text())
    bindings = [d for _, d in k8s_objects() if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert {(s["name"], s["namespace"]) for b in bindings for s in b["subjects"]} == {
        (values["global"]["serviceAccountName"], K8sSettings().namespace)
    }


@pytest.fixture
def instance_config(tmp_path):
    shutil.copy(DEPLOY / "dagster.yaml", tmp_path / "dagster.yaml")
    config, _ = dagster_instance_config(str(tmp_path))
    return config


def test_dagster_yaml_is_a_valid_instance_with_postgres_k8s_launcher_and_our_coordinator(instance_config):
    assert set(instance_config["storage"]) == {"postgres"}
    assert (instance_config["run_launcher"]["module"], instance_config["run_launcher"]["class"]) == (
        "dagster_k8s",
        "K8sRunLauncher",
    )
    assert (instance_config["run_coordinator"]["module"], instance_config["run_coordinator"]["class"]) == (
        "xirang_platform.dagster_defs.coordinator",
        "XirangRunCoordinator",
    )


def test_the_launcher_config_passes_k8s_run_launchers_own_schema(instance_config):
    result = validate_config(K8sRunLauncher.config_type(), instance_config["run_launcher"]["config"])
    assert result.success, result.errors
    assert instance_config["run_launcher"]["config"]["job_namespace"] == K8sSettings().namespace


def test_a_wrong_launcher_key_is_rejected_by_that_schema(instance_config):
    wrong = {**instance_config["run_launcher"]["config"], "job_namspace": "xirang"}
    assert not validate_config(K8sRunLauncher.config_type(), wrong).success


def test_the_coordinator_config_passes_the_queued_coordinator_schema_plus_platform_config(instance_config):
    # XirangRunCoordinator.config_type() (issue 12's coordinator) is QueuedRunCoordinator's plus platform_config.
    schema = {**QueuedRunCoordinator.config_type(), "platform_config": Field(StringSource, is_required=False)}
    result = validate_config(schema, instance_config["run_coordinator"]["config"])
    assert result.success, result.errors


def test_helm_values_produce_the_same_coordinator_and_launcher_as_dagster_yaml(instance_config):
    values = yaml.safe_load((DEPLOY / "helm-values.yaml").read_text())
    runner = values["dagsterDaemon"]["runCoordinator"]
    assert (runner["enabled"], runner["type"]) == (True, "CustomRunCoordinator")
    custom = runner["config"]["customRunCoordinator"]
    assert {k: custom[k] for k in ("module", "class", "config")} == instance_config["run_coordinator"]
    launcher = values["runLauncher"]
    assert launcher["type"] == "K8sRunLauncher"
    assert (
        launcher["config"]["k8sRunLauncher"]["jobNamespace"]
        == instance_config["run_launcher"]["config"]["job_namespace"]
    )
    assert values["postgresql"]["postgresqlScheme"] == instance_config["storage"]["postgres"]["postgres_db"]["scheme"]


@pytest.mark.parametrize("component", ["dagsterWebserver", "dagsterDaemon", "user-code"])
def test_helm_components_get_the_ledger_secret_and_config_as_a_valid_pod(component):
    values = yaml.safe_load((DEPLOY / "helm-values.yaml").read_text())
    part = values["dagster-user-deployments"]["deployments"][0] if component == "user-code" else values[component]
    assert {"name": "xirang-ledger"} in part["envSecrets"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": component.lower()},
        "spec": {
            "volumes": part["volumes"],
            "containers": [
                {
                    "name": "c",
                    "image": f"{part['image']['repository']}:{part['image']['tag']}",
                    "imagePullPolicy": part["image"]["pullPolicy"],
                    "volumeMounts": part["volumeMounts"],
                    "envFrom": [{"secretRef": s} for s in part["envSecrets"]]
                    + [{"configMapRef": c} for c in part["envConfigMaps"]],
                }
            ],
        },
    }
    validate_strictly(pod)
    shipped = {(d["kind"], d["metadata"]["name"]) for _, d in k8s_objects()}
    assert {("Secret", s["name"]) for s in part["envSecrets"]} <= shipped
    assert {("ConfigMap", c["name"]) for c in part["envConfigMaps"]} <= shipped


def test_the_shipped_launcher_settings_are_the_documented_defaults():
    assert load_settings(DEPLOY / "xirang-k8s.yaml") == K8sSettings()
