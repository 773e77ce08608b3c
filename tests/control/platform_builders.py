"""Builders for the platform layer's tests: platform configs on the tests' pool, runs behind the gate.

The pool is `tests/dagster/pool.yaml`: two 8-GPU H100 servers in one domain and one 4 x L40S server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xirang_platform.control.platform_config import PlatformConfig, config_from_dict
from xirang_platform.control.tick_plan import GatedRun
from xirang_platform.dagster_defs.coordinator import request_run_tags
from xirang_platform.scheduling.model import Request, Tier

POOL_FILE = Path(__file__).resolve().parents[1] / "dagster" / "pool.yaml"

# The smallest document the loader takes: two tenants, each its own code location (the bundled pool).
GOOD: dict[str, Any] = {
    "tenants": {"research": {"quota_gpus": 8, "projects": {"llm": {}}}, "product": {"quota_gpus": 4}},
    "locations": {"research": "research", "product": "product"},
}

# Each tenant's one project in `two_tenants`.
PROJECT = {"research": "llm", "product": "serving"}


def two_tenants(llm_quota_gpus: int | None = None) -> PlatformConfig:
    """research (12 GPUs, cap 14.4 at ratio 1.2; project llm, with `llm_quota_gpus` of its own if given)
    and product (8 GPUs; project serving) on the tests' pool, without a minimum runtime."""
    llm = {} if llm_quota_gpus is None else {"quota_gpus": llm_quota_gpus}
    return config_from_dict(
        {
            "pool": str(POOL_FILE),
            "tenants": {
                "research": {"quota_gpus": 12, "projects": {"llm": llm}},
                "product": {"quota_gpus": 8, "projects": {"serving": {}}},
            },
            "locations": {"research": "research", "product": "product"},
            "scheduler": {"min_runtime_s": 0},
        }
    )


def gated(run_id: str, tenant: str, project: str, tier: Tier, gpus: int) -> GatedRun:
    """A queued run behind the gate asking for `gpus` whole GPUs."""
    request = Request(run_id, tenant, project, tier, 0.0, gpus=gpus, single_node=tier is Tier.INFERENCE)
    return GatedRun(run_id, request_run_tags(request), tenant)
