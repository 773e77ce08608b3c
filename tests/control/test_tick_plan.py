"""The tick's plan step (`xirang_platform/control/tick_plan.plan_tick`): which holds fail a run at once, which wait.

Pool (tests/dagster/pool.yaml): two 8-GPU H100 servers in one domain and one 4 x L40S server.
research/llm has a project quota of 4 GPUs (cap 4.8 at ratio 1.2); product 8 GPUs.
"""

from __future__ import annotations

import pytest

from tests.control.platform_builders import gated, two_tenants
from xirang_platform.control import run_tags as rt
from xirang_platform.control.tick_plan import GatedRun, hold_cause, hold_text, plan_tick
from xirang_platform.scheduling.holds import no_fit_message
from xirang_platform.scheduling.model import GpuRange, Hold, HoldReason, Request, Tier
from xirang_platform.scheduling.quota import AccountKey, Balance

CONFIG = two_tenants(llm_quota_gpus=4)


@pytest.mark.parametrize(
    ("run", "fails_with"),
    [
        pytest.param(
            gated("r1", "research", "llm", Tier.INFERENCE, 6), "exceeds-cap", id="p0 over its project cap fails"
        ),
        pytest.param(gated("r2", "product", "serving", Tier.INFERENCE, 9), "never-fits", id="p0 wider than any node"),
        pytest.param(gated("r3", "research", "llm", Tier.INFERENCE, 4), None, id="p0 within its cap is admitted"),
        pytest.param(gated("r4", "research", "llm", Tier.OFFLINE_TRAINING, 6), None, id="p2 past its cap borrows"),
    ],
)
def test_holds_no_later_tick_can_lift_fail_the_run(run: GatedRun, fails_with: str | None) -> None:
    plan = plan_tick(CONFIG.pool, CONFIG.book, [], [run], 100.0, CONFIG)
    if fails_with is None:
        assert plan.failures == {}
        assert plan.result.admitted(run.run_id) is not None
    else:
        assert plan.failures[run.run_id].startswith(f"{fails_with}: ")
        assert plan.result.admitted(run.run_id) is None


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        pytest.param(
            "quota: tenant research at its cap, 8 of 14.4 GPUs held, 8 asked (inference may not borrow)",
            "quota: tenant research at its cap",
            id="quota: balances aside",
        ),
        pytest.param(
            "capacity: no room for 2 GPUs now (no node has 2 free)",
            "capacity: no room for 2 GPUs now",
            id="capacity: the ask stays, the detail goes",
        ),
        pytest.param(
            "reserved: units held back for the starving gang g1",
            "reserved: units held back for the starving gang g1",
            id="reserved for a gang",
        ),
        pytest.param(
            "queued: waiting for the next scheduling tick",
            "queued: waiting for the next scheduling tick",
            id="the coordinator's text",
        ),
        pytest.param("", "", id="no reason yet"),
    ],
)
def test_a_hold_cause_is_the_text_without_its_numbers(text: str, cause: str) -> None:
    assert hold_cause(text) == cause


class BrokenTags(dict):
    """Tags whose reading raises, as a bug in the parser would."""

    def items(self):  # type: ignore[override]
        raise RuntimeError("cannot read")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        pytest.param(
            {rt.PREEMPTED: "3000000000"}, "xirang/preempted='3000000000' is out of range", id="overflowing count"
        ),
        pytest.param(
            {rt.RECLAIMS: "3000000000"}, "xirang/reclaims='3000000000' is out of range", id="overflowing reclaims"
        ),
        pytest.param(
            {rt.GPU_MEMORY_GB: "1e308"}, "xirang/gpu-memory-gb='1e308' is not a plain", id="overflowing memory"
        ),
        pytest.param({rt.GPUS: "\uff14"}, "xirang/gpus='\uff14' is not a whole number", id="other scripts' digits"),
        pytest.param(None, "could not read this run's tags", id="a parser error"),
    ],
)
def test_a_run_whose_tags_no_longer_parse_fails_alone_and_the_others_are_planned(
    bad: dict[str, str] | None, message: str
) -> None:
    good = gated("good", "product", "serving", Tier.OFFLINE_TRAINING, 2)
    tags = BrokenTags(good.tags) if bad is None else {**good.tags, **bad}
    plan = plan_tick(CONFIG.pool, CONFIG.book, [], [GatedRun("bad", tags, "product"), good], 100.0, CONFIG)
    assert list(plan.failures) == ["bad"]
    assert message in plan.failures["bad"]
    assert [ad.request_id for ad in plan.result.admits] == ["good"]


@pytest.mark.parametrize(
    ("hold", "want"),
    [
        pytest.param(
            Hold("r1", HoldReason.RESERVED_FOR_GANG, "units are held back for the starving gang g2"),
            "reserved: units are held back for the starving gang g2",
            id="a reserved hold names the gang the cycle says binds it, not the oldest held gang",
        ),
        pytest.param(
            Hold("r1", HoldReason.ALREADY_RUNNING, "a request of this id has been running since t=5"),
            "duplicate: a request of this id has been running since t=5",
            id="a run already running is said to be a duplicate, not to lack room",
        ),
        pytest.param(
            Hold("r1", HoldReason.NO_FIT, "no node has 2 free GPUs"),
            "capacity: no room for 2 GPUs now (no node has 2 free GPUs)",
            id="a run without room says what it asks",
        ),
        pytest.param(
            Hold(
                "r1",
                HoldReason.NO_FIT,
                "no free units fit r1 (offline-training, 2 GPU, 0 milli-CPU, 0 MiB) now; it waits for capacity",
            ),
            "capacity: no room for 2 GPUs now",
            id="the cycle's no-fit message, which only restates the request, is left out",
        ),
    ],
)
def test_a_hold_text_says_what_the_cycle_said_is_in_the_way(hold: Hold, want: str) -> None:
    request = Request("r1", "product", "serving", Tier.OFFLINE_TRAINING, 0.0, gpus=2)
    assert hold_text(hold, request, CONFIG.book, {}, 1.2) == want


TENANT, PROJECT = AccountKey("research"), AccountKey("research", "llm")


@pytest.mark.parametrize(
    ("tenant_held", "project_held", "text"),
    [
        pytest.param(
            14,
            0,
            "quota: tenant research at its cap, 14 of 14.4 GPUs held, 1 asked (inference may not borrow)",
            id="the tenant's cap binds",
        ),
        pytest.param(
            5,
            4,
            "quota: project research/llm at its cap, 4 of 4.8 GPUs held, 1 asked (inference may not borrow)",
            id="the project's cap binds under a tenant with room",
        ),
        pytest.param(
            14,
            4,
            "quota: tenant research at its cap, 14 of 14.4 GPUs held, 1 asked (inference may not borrow)",
            id="both bind: the tenant, first in the quota check, is named",
        ),
        pytest.param(
            2,
            1,
            "quota: research/llm is over its cap",
            id="no cap binds on the balances after the cycle: the cycle's own message",
        ),
    ],
)
def test_a_quota_hold_names_the_account_whose_cap_binds(tenant_held: int, project_held: int, text: str) -> None:
    request = Request("r1", "research", "llm", Tier.INFERENCE, 0.0, gpus=1, single_node=True)
    balances = {TENANT: Balance(12_000, used=tenant_held * 1000), PROJECT: Balance(4_000, used=project_held * 1000)}
    hold = Hold("r1", HoldReason.OVER_QUOTA, "research/llm is over its cap")
    assert hold_text(hold, request, CONFIG.book, balances, 1.2) == text


@pytest.mark.parametrize(
    ("elastic", "want"),
    [
        pytest.param(GpuRange(2, 8), "capacity: no room for 2 to 8 GPUs now", id="an elastic range"),
        pytest.param(GpuRange(2, 8, 3), "capacity: no room for 2 to 8 GPUs in steps of 3 now", id="with a step"),
    ],
)
def test_an_elastic_run_without_room_says_its_range(elastic: GpuRange, want: str) -> None:
    request = Request("r1", "product", "serving", Tier.OFFLINE_TRAINING, 0.0, gpus=8, elastic=elastic)
    assert (
        hold_text(Hold("r1", HoldReason.NO_FIT, no_fit_message(request, None)), request, CONFIG.book, {}, 1.2) == want
    )
