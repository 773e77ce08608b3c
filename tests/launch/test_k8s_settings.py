"""The launcher settings file: defaults, every field read, and every malformed field refused naming it and the fix."""

from __future__ import annotations

import pytest

from tests.launch.k8s_builders import alloc, launch_pool
from xirang_platform.launch.k8s import dagster_k8s_config
from xirang_platform.launch.k8s_settings import (
    SETTINGS_ENV,
    FractionSharing,
    GpuRequest,
    K8sSettings,
    K8sSettingsError,
    Toleration,
    load_settings,
    settings_from_env,
    settings_from_mapping,
)
from xirang_platform.scheduling.model import Tier


def test_an_empty_file_means_the_defaults(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("")
    assert load_settings(path) == K8sSettings()


def test_every_field_is_read():
    got = settings_from_mapping(
        {
            "namespace": "ml",
            "image": "registry/x:1",
            "gpu_request": "dra",
            "fraction_sharing": "hami",
            "gpu_tolerations": [{"key": "gpu", "operator": "Equal", "value": "a100", "effect": "NoExecute"}],
            "priority_classes": {"inference": "serve-critical"},
            "rendezvous_port": 23456,
        }
    )
    assert (got.namespace, got.image, got.gpu_request, got.fraction_sharing, got.rendezvous_port) == (
        "ml",
        "registry/x:1",
        GpuRequest.DRA,
        FractionSharing.HAMI,
        23456,
    )
    assert got.gpu_tolerations == (Toleration("gpu", "Equal", "a100", "NoExecute"),)
    assert got.priority_class(Tier.INFERENCE) == "serve-critical"
    assert got.priority_class(Tier.BATCH_INFERENCE) == "xirang-batch-inference"  # the others keep their defaults


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        pytest.param({"namespce": "ml"}, "namespce: is not a setting; did you mean 'namespace'?", id="unknown-key"),
        pytest.param(
            {"gpu_request": "mig"}, "gpu_request: 'mig' is not a choice; use one of device-plugin, dra", id="bad-choice"
        ),
        pytest.param({"fraction_sharing": "mps"}, "use one of time-slicing, hami", id="bad-sharing"),
        pytest.param(
            {"gpu_tolerations": [{"operator": "Exists"}]},
            "gpu_tolerations[0]: has no `key`",
            id="toleration-without-key",
        ),
        pytest.param(
            {"gpu_tolerations": [{"key": "g", "effect": "Never"}]}, "gpu_tolerations[0].effect", id="bad-effect"
        ),
        pytest.param(
            {"priority_classes": {"p0": "x"}},
            "priority_classes.p0: 'p0' is not a choice; use one of inference",
            id="bad-tier",
        ),
        pytest.param({"rendezvous_port": 70000}, "rendezvous_port: 70000 is not a port", id="bad-port"),
        pytest.param({"namespace": ""}, "namespace: '' is not a non-empty string", id="empty-namespace"),
        pytest.param(["namespace"], "document: is not a mapping", id="not-a-mapping"),
    ],
)
def test_malformed_settings_are_refused_naming_the_field_and_fix(doc, says):
    with pytest.raises(K8sSettingsError) as info:
        settings_from_mapping(doc, "s.yaml")
    assert str(info.value).startswith("s.yaml: ")
    assert says in str(info.value)


def test_the_tag_without_settings_reads_the_file_the_environment_names(tmp_path, monkeypatch):
    path = tmp_path / "xirang-k8s.yaml"
    path.write_text("priority_classes: {offline-training: batch-low}\n")
    monkeypatch.setenv(SETTINGS_ENV, str(path))
    assert settings_from_env().priority_class(Tier.OFFLINE_TRAINING) == "batch-low"
    tag = dagster_k8s_config(alloc("a").gpus("h100-0", 0).build(), launch_pool())
    assert '"priority_class_name":"batch-low"' in tag
    monkeypatch.delenv(SETTINGS_ENV)
    assert settings_from_env() == K8sSettings()
