"""A tick never stalls on one expensive cycle (DESIGN.md 5.6): the preemption search is bounded in
steps, requests the budget does not reach wait `deferred` (their hold reason says so, and the next
tick reads them back first in their tier), and the tick's wall-clock guard defers what it cannot
reach in time. The other tenants' runs that fit are admitted all the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.control.platform_builders import gated
from xirang_platform.control import run_tags as rt
from xirang_platform.control.platform_config import PlatformConfig, config_from_dict
from xirang_platform.control.tick_plan import GatedRun, parse_gated, plan_tick, was_deferred
from xirang_platform.dagster_defs.coordinator import admission_tags
from xirang_platform.scheduling.model import Allocation, GpuSlice, HoldReason, NodeShare, Placement, Request, Tier

NODES = 40  # the pool on which round 2's exact search did not finish five requests in five minutes


def _platform(tmp_path: Path, scheduler: dict | None = None) -> PlatformConfig:
    """40 8-GPU H100 servers in one domain; research's quota is what it holds (`_research_work`: 304
    GPUs), product's 16: together the pool."""
    pool = tmp_path / "pool.yaml"
    pool.write_text(
        "schema_version: 1\nname: worst\nnodes:\n  - {name: 'n-{index:02d}', "
        f"count: {NODES}, model: H100-SXM, gpus: 8, cpu: 224, memory: 2Ti, domain: d}}\n",
        encoding="utf-8",
    )
    return config_from_dict(
        {
            "pool": str(pool),
            "tenants": {
                "research": {"quota_gpus": 304, "projects": {"llm": {}}},
                "product": {"quota_gpus": 16, "projects": {"serving": {}}},
            },
            "locations": {"research": "research", "product": "product"},
            "scheduler": {"min_runtime_s": 0, "overcommit": {"max_ratio": 1.0}, **(scheduler or {})},
        }
    )


def _research_work(platform: PlatformConfig) -> list[Allocation]:
    """The first 38 nodes full of research's small in-quota P2 work (304 GPUs: its whole quota, so every
    plan of research's must stop its own work to relieve its cap), the last 2 nodes free."""
    out = []
    for node in platform.pool.nodes[:38]:
        for g in range(0, 8, 2 if int(node.name[-2:]) % 2 else 1):
            size = 2 if int(node.name[-2:]) % 2 else 1
            r = Request(f"w-{node.name}-{g}", "research", "llm", Tier.OFFLINE_TRAINING, 0.0, gpus=size)
            slices = tuple(GpuSlice(node.name, x, 1000) for x in range(g, g + size))
            out.append(Allocation(r, Placement(slices, (NodeShare(node.name, 0, 0),)), start=float(g * 100)))
    return out


def _runs() -> list[GatedRun]:
    research = [gated(f"gang-{k}", "research", "llm", Tier.ONLINE_TRAINING, 8) for k in range(5)]
    # product holds nothing: of online training, its runs come first (fair share) and fill the free nodes.
    product = [gated(f"fits-{k}", "product", "serving", Tier.ONLINE_TRAINING, 4) for k in range(4)]
    return [*research, *product]


@pytest.mark.parametrize(
    ("scheduler", "deferred"),
    [
        pytest.param({}, False, id="the default budget plans every gang of the worst pool"),
        pytest.param({"plan_steps_per_cycle": 400}, True, id="a small budget plans the first gangs, defers the rest"),
    ],
)
def test_a_tick_over_a_pool_whose_search_would_explode_admits_the_fitting_runs(tmp_path, scheduler, deferred) -> None:
    platform = _platform(tmp_path, scheduler)
    plan = plan_tick(platform.pool, platform.book, _research_work(platform), _runs(), 10_000.0, platform)
    admitted = {a.request_id for a in plan.result.admits}
    assert {f"fits-{k}" for k in range(4)} <= admitted, "product's runs fit the free nodes: admitted"
    held = {h.request_id: h.reason for h in plan.result.holds}
    assert any(reason is HoldReason.DEFERRED for reason in held.values()) == deferred
    assert set(held) <= {f"gang-{k}" for k in range(5)}, "only research's gangs wait"
    budget = platform.scheduler.plan_steps_per_cycle
    assert plan.result.work.plan_steps <= budget + platform.scheduler.plan_steps_per_request + 4 * 8 * 8 * 2
    for run_id, reason in held.items():
        if reason is HoldReason.DEFERRED:
            assert plan.hold_texts[run_id].startswith("deferred: "), plan.hold_texts[run_id]


def test_a_run_held_deferred_is_read_back_first_in_its_tier(tmp_path) -> None:
    platform = _platform(tmp_path, {"plan_steps_per_cycle": 400})
    work = _research_work(platform)
    first = plan_tick(platform.pool, platform.book, work, _runs(), 10_000.0, platform)
    # The next tick sees each held run with the hold reason the tick wrote on it.
    again = [
        GatedRun(r.run_id, {**r.tags, rt.HOLD_REASON: first.hold_texts.get(r.run_id, "")}, r.location)
        for r in _runs()
        if first.result.admitted(r.run_id) is None
    ]
    requests, failures = parse_gated(again, platform)
    assert failures == {}
    deferred = {r.id for r in requests if r.deferred}
    assert deferred == {h.request_id for h in first.result.holds if h.reason is HoldReason.DEFERRED}
    assert all(was_deferred(r.tags) == (r.run_id in deferred) for r in again)


def test_the_ticks_wall_clock_guard_defers_what_it_does_not_reach(tmp_path) -> None:
    platform = _platform(tmp_path)
    plan = plan_tick(
        platform.pool, platform.book, _research_work(platform), _runs(), 10_000.0, platform, out_of_time=lambda: True
    )
    assert plan.result.admits == ()
    assert plan.failures == {}
    assert {h.reason for h in plan.result.holds} == {HoldReason.DEFERRED}
    assert all(text.startswith("deferred: ") for text in plan.hold_texts.values())


def test_a_user_cannot_mark_a_run_deferred(tmp_path) -> None:
    """The hold reason is a platform tag: what the coordinator writes at submission replaces a run's
    own `deferred: ...`, so only the tick can mark a run deferred."""
    platform = _platform(tmp_path)
    run = gated("cheat", "product", "serving", Tier.OFFLINE_TRAINING, 1)
    forged = {**run.tags, rt.HOLD_REASON: "deferred: let me in first"}
    written = admission_tags(forged, "product", platform, "cheat", 10.0)
    assert not isinstance(written, rt.TagProblem)
    assert was_deferred(forged)
    assert not was_deferred({**forged, **written})
