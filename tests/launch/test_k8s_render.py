"""`xirang k8s render`: the scripted scenario through the real cycle, every object it writes valid
under Kubernetes 1.33 and 1.37 (kubernetes-validate 1.37.0 bundles both; strict: unknown fields fail),
and the check shown to bite."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest
from typer.testing import CliRunner

from tests.launch.k8s_checks import VERSIONS, validate_strictly, versions_for
from xirang_platform.cli import app
from xirang_platform.launch.k8s_scenario import SCENARIO_POOL, render, rendered_objects, run_scenario
from xirang_platform.launch.k8s_settings import FractionSharing, K8sSettings
from xirang_platform.pool.readers import read_pool


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("render")
    return out, render(out, K8sSettings())


def test_the_scenario_admits_every_case_through_the_cycle():
    result = run_scenario(read_pool(SCENARIO_POOL))
    assert sorted(result.first) == ["chat-0", "chat-1", "finetune-mig", "notebook-frac", "pretrain-gang", "train-whole"]
    assert result.second == ("chat-2",)
    gang = result.allocations["pretrain-gang"]
    assert len(gang.placement.shares) == 2
    assert result.allocations["finetune-mig"].placement.nodes == ("a100-mig-00",)


def test_render_writes_one_file_per_admission_and_the_patches(rendered):
    out, paths = rendered
    assert sorted(p.name for p in paths) == [
        "chat.scale-patches.json",
        "chat.yaml",
        "finetune-mig.dagster-k8s-config.json",
        "finetune-mig.yaml",
        "notebook-frac.dagster-k8s-config.json",
        "notebook-frac.yaml",
        "pretrain-gang.dagster-k8s-config.json",
        "pretrain-gang.pin-patches.json",
        "pretrain-gang.yaml",
        "train-whole.dagster-k8s-config.json",
        "train-whole.yaml",
    ]
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered_objects(paths))
    assert ("Job", "xirang-gang-pretrain-gang") in kinds
    assert ("Service", "xirang-gang-pretrain-gang") in kinds
    assert ("Deployment", "xirang-serve-chat") in kinds
    assert [k for k in kinds if k[1].startswith("dagster-run-")] == [
        ("Job", f"dagster-run-{rid}") for rid in ("finetune-mig", "notebook-frac", "pretrain-gang", "train-whole")
    ]
    scale = json.loads((out / "chat.scale-patches.json").read_text())
    assert scale["deployment"]["spec"] == {"replicas": 3}
    assert json.loads(scale["deployment"]["metadata"]["annotations"]["xirang.io/replicas"]).keys() == {
        "chat-0",
        "chat-1",
        "chat-2",
    }
    assert sorted(scale["pods"]) == ["chat-0", "chat-1", "chat-2"]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_rendered_object_validates_strictly(rendered, version):
    docs = rendered_objects(rendered[1])
    assert len(docs) == 8  # four run-worker Jobs, the gang Job and Service, the Deployment and Service
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_hami_render_validates_too(tmp_path):
    for doc in rendered_objects(render(tmp_path, K8sSettings(fraction_sharing=FractionSharing.HAMI))):
        validate_strictly(doc, versions_for(doc))


def _job(rendered) -> dict:
    return next(d for d in rendered_objects(rendered[1]) if d["metadata"]["name"] == "dagster-run-train-whole")


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        pytest.param(
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(resourcez={}),
            "Additional properties are not allowed ('resourcez' was unexpected)",
            id="unknown-field",
        ),
        pytest.param(
            lambda d: d["spec"].update(backoffLimit="zero"), "'zero' is not of type 'integer'", id="wrong-type"
        ),
        pytest.param(
            lambda d: d["spec"]["template"]["spec"]["affinity"]["nodeAffinity"].update(
                requiredDuringSchedulingIgnoredDuringExecution={"nodeSelectorTerms": "h100-a-01"}
            ),
            "'h100-a-01' is not of type 'array'",
            id="node-terms-not-a-list",
        ),
    ],
)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_check_bites(rendered, breaks, message, version):
    doc = copy.deepcopy(_job(rendered))
    kubernetes_validate.validate(doc, version, strict=True)
    breaks(doc)
    with pytest.raises(kubernetes_validate.ValidationError) as info:
        kubernetes_validate.validate(doc, version, strict=True)
    assert message in str(info.value)


def test_dra_objects_do_not_exist_before_kubernetes_1_34(rendered):
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
        },
    }
    validate_strictly(template, ("1.34.0", "1.37.0"))
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(template, "1.33.0", strict=True)


def test_cli_render_lists_what_it_wrote(tmp_path):
    result = CliRunner().invoke(app, ["k8s", "render", "--out", str(tmp_path / "objs")])
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 11
    assert (tmp_path / "objs" / "pretrain-gang.yaml").exists()


def test_cli_render_refuses_bad_settings_with_the_fix(tmp_path):
    bad = tmp_path / "settings.yaml"
    bad.write_text("namespce: ml\n")
    result = CliRunner().invoke(app, ["k8s", "render", "--out", str(tmp_path / "o"), "--settings", str(bad)])
    assert result.exit_code == 2
    assert "namespce: is not a setting; did you mean 'namespace'?" in result.output
    assert not (tmp_path / "o").exists()


def test_cli_render_in_dra_mode_names_the_fraction_it_cannot_claim(tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text("gpu_request: dra\n")
    result = CliRunner().invoke(app, ["k8s", "render", "--out", str(tmp_path / "o"), "--settings", str(settings)])
    assert result.exit_code == 2
    assert "cannot be claimed through DRA" in result.output
