"""`GpuPoolResource` in a run: the environment it gives the run's process, and what run config may not
change (issue 20 items 3 and 4: a run without GPUs saw every GPU; run config pointed the resource at
another tenants file and the ledger's quotas changed)."""

# No `from __future__ import annotations`: Dagster reads the op's resource annotation at runtime.

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from dagster import Definitions, OpExecutionContext, job, op

from resources.gpu_pool import GpuPoolResource
from xirang_platform.control import run_tags as rt
from xirang_platform.devtools.devserver import server_environment
from xirang_platform.ledger.ledger import Ledger

SEEN: dict[str, str | None] = {}


@op
def look(context: OpExecutionContext, gpu_pool: GpuPoolResource) -> None:
    """Record what the run's process sees, and open the ledger as an asset would."""
    SEEN["CUDA_VISIBLE_DEVICES"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu_pool.ledger().accounts()


@job
def probe() -> None:
    look()


def platform_file(path: Path, ledger_url: str, research_gpus: int) -> Path:
    doc = {
        "ledger_url": ledger_url,
        "tenants": {"research": {"quota_gpus": research_gpus, "projects": {"llm": {}}}},
        "locations": {"research": "research"},
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[Definitions, str]]:
    """The deployment's Definitions (research: 12 GPUs) on a ledger synced from it, as the tick does."""
    url = f"sqlite:///{tmp_path / 'ledger.sqlite'}"
    config = platform_file(tmp_path / "xirang.yaml", url, 12)
    GpuPoolResource(config_path=str(config)).ledger()  # the tick's sync, in a sensor's process
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3,4,5,6,7"  # the host's GPUs
    SEEN.clear()
    yield Definitions(jobs=[probe], resources={"gpu_pool": GpuPoolResource(config_path=str(config))}), url
    if saved is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = saved


def quotas(url: str) -> dict[str, int]:
    ledger = Ledger(url)
    try:
        return dict(ledger.quota_book().tenants)
    finally:
        ledger.close()


def test_a_run_without_gpus_sees_none_and_the_environment_is_put_back(deployment: tuple[Definitions, str]) -> None:
    defs, _ = deployment
    assert defs.resolve_job_def("probe").execute_in_process(tags={rt.TIER: "offline-training"}).success
    assert SEEN["CUDA_VISIBLE_DEVICES"] == ""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


def test_a_run_with_an_allocation_sees_its_gpus(deployment: tuple[Definitions, str]) -> None:
    defs, _ = deployment
    tags = {rt.ALLOCATION: "{}", rt.ENV: json.dumps({"CUDA_VISIBLE_DEVICES": "2,3"})}
    assert defs.resolve_job_def("probe").execute_in_process(tags=tags).success
    assert SEEN["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_an_admitted_kubernetes_run_keeps_the_devices_its_pod_was_given(deployment: tuple[Definitions, str]) -> None:
    defs, _ = deployment  # on Kubernetes the device plugin sets the devices: no `xirang/env` tag
    assert defs.resolve_job_def("probe").execute_in_process(tags={rt.ALLOCATION: "{}"}).success
    assert SEEN["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize("field", ["config_path", "ledger_url"])
def test_run_config_cannot_point_the_resource_at_another_platform(
    deployment: tuple[Definitions, str], tmp_path: Path, field: str
) -> None:
    defs, url = deployment
    other = platform_file(tmp_path / "other.yaml", url, 2)
    values = {"config_path": str(other), "ledger_url": url}
    run_config = {"resources": {"gpu_pool": {"config": {field: values[field]}}}}

    result = defs.resolve_job_def("probe").execute_in_process(run_config=run_config, raise_on_error=False)

    assert not result.success
    (init,) = [e for e in result.all_events if e.event_type_value == "RESOURCE_INIT_FAILURE"]
    failure = init.event_specific_data.error.to_string()  # type: ignore[union-attr]
    assert f"resources.gpu_pool.config.{field}" in failure
    assert "come from the deployment" in failure
    assert SEEN == {}  # the op never ran
    assert quotas(url) == {"research": 12000}


def test_a_run_worker_never_syncs_accounts(deployment: tuple[Definitions, str], tmp_path: Path) -> None:
    # A fresh ledger nobody synced: a run's process opening it must not write accounts into it.
    url = f"sqlite:///{tmp_path / 'fresh.sqlite'}"
    config = platform_file(tmp_path / "fresh.yaml", url, 12)
    defs = Definitions(jobs=[probe], resources={"gpu_pool": GpuPoolResource(config_path=str(config))})
    assert defs.resolve_job_def("probe").execute_in_process().success
    assert quotas(url) == {}


def test_the_embedded_code_servers_start_every_run_process_without_a_gpu(tmp_path: Path) -> None:
    # A job that does not use `gpu_pool` never runs the resource, so it inherits the code server's
    # environment: the embedded default starts `dagster dev` with no GPU visible (the Makefile's
    # `make run` says the same), and only the resource gives an admitted run its own devices.
    os.environ["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    try:
        env = server_environment(tmp_path, {"XIRANG_CONFIG": "x.yaml"})
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert (env["DAGSTER_HOME"], env["XIRANG_CONFIG"]) == (str(tmp_path), "x.yaml")
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")  # one shell line
    [run_line] = [line for line in recipe.splitlines() if "dagster dev" in line and "$(BIN)" in line]
    before = run_line[: run_line.index("/dagster dev")]
    assert re.search(r"(^|[\s;@])(export\s+)?CUDA_VISIBLE_DEVICES=(\s|;)", before), run_line
