"""The serving registry: Prometheus file_sd files, one per service, written atomically."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from xirang_platform.serving import registry
from xirang_platform.serving.registry import Endpoint, RegistryError

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")  # Prometheus' rule for label names


def ep(run_id: str, port: int = 9000, service: str = "digits", version: str = "1") -> Endpoint:
    return Endpoint(service, run_id, "127.0.0.1", port, version)


def test_a_registered_endpoint_is_listed_and_a_deregistered_one_is_not(tmp_path: Path) -> None:
    registry.register(tmp_path, ep("b", 9002))
    registry.register(tmp_path, ep("a", 9001))
    registry.register(tmp_path, ep("c", 9003, service="other"))
    assert registry.endpoints(tmp_path, "digits") == [ep("a", 9001), ep("b", 9002)]
    assert registry.deregister(tmp_path, "a") is True
    assert registry.deregister(tmp_path, "a") is False
    assert registry.endpoints(tmp_path) == [ep("b", 9002), ep("c", 9003, service="other")]
    assert registry.services(tmp_path) == ["digits", "other"]


def test_registering_a_run_again_replaces_its_entry(tmp_path: Path) -> None:
    registry.register(tmp_path, ep("a", 9001, version="1"))
    registry.register(tmp_path, ep("a", 9005, version="2"))
    assert registry.endpoints(tmp_path, "digits") == [ep("a", 9005, version="2")]


def test_the_file_is_prometheus_file_sd_json_one_target_group_per_replica(tmp_path: Path) -> None:
    registry.register(tmp_path, ep("a", 9001))
    registry.register(tmp_path, Endpoint("digits", "b", "::1", 9002, "3"))
    doc = json.loads((tmp_path / "digits.json").read_text())
    assert isinstance(doc, list)
    for group in doc:
        assert set(group) == {"targets", "labels"}
        assert all(re.match(r"^(\[[0-9a-f:]+\]|[\w.-]+):\d+$", t) for t in group["targets"])
        assert all(LABEL_NAME.match(k) and isinstance(v, str) for k, v in group["labels"].items())
    assert doc == [
        {"targets": ["127.0.0.1:9001"], "labels": {"service": "digits", "run_id": "a", "model_version": "1"}},
        {"targets": ["[::1]:9002"], "labels": {"service": "digits", "run_id": "b", "model_version": "3"}},
    ]
    assert registry.endpoints(tmp_path, "digits")[1].host == "::1"  # read back as written
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".json") == ["digits.json"]  # no temp left


def test_replicas_registering_at_once_all_stay_listed(tmp_path: Path) -> None:
    threads = [
        threading.Thread(target=registry.register, args=(tmp_path, ep(f"r{i:02d}", 9000 + i))) for i in range(24)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.run_id for e in registry.endpoints(tmp_path, "digits")] == [f"r{i:02d}" for i in range(24)]


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param("{not json", "not valid JSON", id="a file that is not JSON names the file and the fix"),
        pytest.param('{"targets": []}', "expected a file_sd list", id="a file that is not a list is refused"),
        pytest.param(
            '[{"targets": ["h:1"], "labels": {"run_id": "x"}}]',
            "target group 0",
            id="a target group without a service label names the group",
        ),
        pytest.param(
            '[{"targets": ["h:port"], "labels": {"service": "s", "run_id": "x"}}]',
            "target group 0",
            id="a target without a numeric port names the group",
        ),
    ],
)
def test_a_broken_registry_file_is_a_clear_error(tmp_path: Path, content: str, problem: str) -> None:
    (tmp_path / "digits.json").write_text(content)
    with pytest.raises(RegistryError, match=problem) as e:
        registry.endpoints(tmp_path, "digits")
    assert str(tmp_path / "digits.json") in str(e.value)
    assert "delete the file" in str(e.value)


@pytest.mark.parametrize("name", ["../escape", "a/b", "", ".hidden"], ids=lambda n: f"service name {n!r} is refused")
def test_a_service_name_that_cannot_name_a_file_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(RegistryError, match="cannot name a registry file"):
        registry.register(tmp_path, ep("a", service=name))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"XIRANG_SERVING_DIR": "/srv/sd", "DAGSTER_HOME": "/home/d"}, "/srv/sd", id="the env var wins"),
        pytest.param({"DAGSTER_HOME": "/home/d"}, "/home/d/xirang-serving/endpoints", id="else under DAGSTER_HOME"),
        pytest.param(
            {}, ".xirang/dagster/xirang-serving/endpoints", id="else under make run's Dagster home, from the repo root"
        ),
    ],
)
def test_the_registry_directory_comes_from_one_place(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: str
) -> None:
    for key in ("XIRANG_SERVING_DIR", "DAGSTER_HOME"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert registry.registry_dir() == Path(expected)


operations = st.lists(
    st.tuples(st.booleans(), st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["s1", "s2"]), st.integers(1, 5)),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops=operations)
def test_the_listing_is_always_what_was_registered_and_not_deregistered(tmp_path_factory, ops) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("reg")
    model: dict[str, Endpoint] = {}
    for add, run_id, service, port in ops:
        if add:
            model[run_id] = Endpoint(service, run_id, "127.0.0.1", 9000 + port, "1")
            registry.register(directory, model[run_id])
        else:
            assert registry.deregister(directory, run_id) is (run_id in model)
            model.pop(run_id, None)
    assert registry.endpoints(directory) == sorted(model.values())
