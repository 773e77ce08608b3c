"""The platform config (`xirang.yaml`) and the local launcher's environment, without Dagster."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from tests.control.platform_builders import GOOD
from xirang_platform.control.platform_config import (
    PlatformConfigError,
    PlatformConfigWarning,
    config_from_dict,
    load_config,
)
from xirang_platform.launch.local import local_environment
from xirang_platform.scheduling.model import Allocation, GpuSlice, NodeShare, Placement, Request, Tier

REPO = Path(__file__).resolve().parents[2]


def test_the_repository_config_loads_with_its_two_locations() -> None:
    config = load_config(REPO / "xirang.yaml")
    assert config.locations == {"research": "research", "product": "product"}
    assert config.tenant_for("product") == "product"
    assert config.tenant_for("elsewhere") is None
    assert config.projects_of("research") == ["llm", "vision"]
    assert config.launcher == "local"
    assert config.tick_interval_s == 5
    assert config.hosts_tick("research")
    assert not config.hosts_tick("product")
    assert config.pool.gpus == 128


def test_relative_paths_resolve_beside_the_file(tmp_path: Path) -> None:
    (tmp_path / "xirang.yaml").write_text(yaml.safe_dump({**GOOD, "ledger_url": "sqlite:///state/l.sqlite"}))
    config = load_config(tmp_path / "xirang.yaml")
    assert config.ledger_url == f"sqlite:///{tmp_path / 'state/l.sqlite'}"
    assert config.book.tenants == {"research": 8000, "product": 4000}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"launcher": "slurm"}, "launcher 'slurm' is not known: use one of local, k8s", id="launcher"),
        pytest.param(
            {"locations": {"ads": "marketing"}}, "names tenant 'marketing', which `tenants:` lacks", id="location"
        ),
        pytest.param({"tenant": {}}, "unknown key 'tenant'; did you mean 'tenants'?", id="misspelt key"),
        pytest.param(
            {"tick": {"interval_s": 0}}, "tick.interval_s must be a whole number of seconds >= 1", id="interval"
        ),
        pytest.param(
            {"tick": {"location": "ads"}}, "tick.location 'ads' is not under `locations:`", id="tick location"
        ),
        pytest.param({"scheduler": {"overcommit": {"max_ratio": 0.5}}}, "max_ratio must be >= 1.0", id="overcommit"),
        pytest.param({"tenants": {}}, "`tenants:` must map tenant names to quotas", id="no tenants"),
        pytest.param(
            {"scheduler": {"min_runtime_by_level": [0]}},
            "min_runtime_by_level: expected a mapping of tier level to seconds",
            id="levels not a mapping",
        ),
        pytest.param(
            {"scheduler": {"min_runtime_by_level": {"P9": 0}}},
            "minimum runtime for unknown tier level 'P9'",
            id="unknown level",
        ),
        pytest.param({"scheduler": {"lend_after_s": -1}}, "must be >= 0 seconds", id="negative lend_after_s"),
        pytest.param({"scheduler": {"lend_forecast_s": 0}}, "lend_forecast_s must be > 0", id="zero lend_forecast_s"),
    ],
)
def test_a_bad_config_names_the_key_and_the_fix(change: dict, message: str) -> None:
    with pytest.raises(PlatformConfigError) as err:
        config_from_dict({**GOOD, **change})
    assert message in str(err.value)


def test_the_scheduler_section_sets_the_borrow_rules_and_the_minimum_runtime_per_tier() -> None:
    doc = {"min_runtime_by_level": {"P0": 0, "P1": 300}, "reclaim_backoff_s": 600, "lend_after_s": 900}
    scheduler = config_from_dict({**GOOD, "scheduler": doc}).scheduler
    assert scheduler.min_runtime_by_level == (("P0", 0.0), ("P1", 300.0))
    assert (scheduler.reclaim_backoff_s, scheduler.lend_after_s) == (600.0, 900.0)
    assert config_from_dict(GOOD).scheduler.min_runtime_by_level == (("P0", 0.0),)  # the default


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        pytest.param({}, (None, 7200.0), id="defaults: no checkpoint interval, so no lending forecast"),
        pytest.param({"checkpoint_interval_s": 1800, "lend_forecast_s": 3600}, (1800.0, 3600.0), id="both set"),
        pytest.param({"checkpoint_interval_s": 1800, "lend_forecast_s": None}, (1800.0, None), id="forecast off"),
    ],
)
def test_the_scheduler_section_sets_the_lending_forecast(doc: dict, want: tuple) -> None:
    scheduler = config_from_dict({**GOOD, "scheduler": doc}).scheduler
    assert (scheduler.checkpoint_interval_s, scheduler.lend_forecast_s) == want


def test_a_missing_config_says_where_to_get_one(tmp_path: Path) -> None:
    with pytest.raises(PlatformConfigError, match="copy xirang.yaml from the repository root"):
        load_config(tmp_path / "absent.yaml")


def test_the_local_environment_names_the_gpus_of_the_run_node() -> None:
    request = Request("r1", "research", "llm", Tier.ONLINE_TRAINING, 0.0, gpus=2)
    placement = Placement(
        (GpuSlice("h100-01", 6, 1000, 81920), GpuSlice("h100-01", 2, 1000, 81920)), (NodeShare("h100-01", 8000, 0),)
    )
    env = local_environment(Allocation(request, placement, 0.0))
    assert env["CUDA_VISIBLE_DEVICES"] == "2,6"
    assert env["XIRANG_NODE"] == "h100-01"
    assert env["XIRANG_GPU_MILLI"] == "2000"
    assert json.loads(env["XIRANG_ALLOCATION"])["nodes"] == [
        {"node": "h100-01", "gpus": [2, 6], "cpu_milli": 8000, "memory_mib": 0}
    ]


def test_tenant_quotas_summing_past_the_pool_are_loaded_with_a_warning_naming_both_sums() -> None:
    # issue 20 item 9: quotas of 100 + 60 GPUs on the bundled 128-GPU pool were accepted without a word
    doc = {**GOOD, "tenants": {"research": {"quota_gpus": 100}, "product": {"quota_gpus": 60}}}
    with pytest.warns(PlatformConfigWarning) as caught:
        config = config_from_dict(doc, source="big.yaml")
    assert config.book.tenants == {"research": 100000, "product": 60000}  # overcommit is allowed
    (warning,) = caught
    assert str(warning.message).startswith("big.yaml: tenant quotas sum to 160 GPUs, more than the pool's 128")
    assert "lower a tenant's quota_gpus" in str(warning.message)


@pytest.mark.parametrize("gpus", [(8, 4), (64, 64)], ids=["well under the pool", "exactly the pool"])
def test_tenant_quotas_within_the_pool_load_silently(gpus: tuple[int, int]) -> None:
    doc = {**GOOD, "tenants": {"research": {"quota_gpus": gpus[0]}, "product": {"quota_gpus": gpus[1]}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_from_dict(doc)
