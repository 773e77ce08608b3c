"""The tick lends lasting idle quota to a reclaimed borrower as the simulator does: its snapshot's
`lasting_idle` comes from the ledger's entries (`Ledger.idle_history`), and a resumption inherits its
reclaims from the ledger's record of its preemption (`ledger.preemptions`).

Pool (tests/dagster/pool.yaml): two 8-GPU H100 servers and one 4 x L40S server. research holds its
12 GPUs of quota (8 H100 + 4 L40S); product held 4 H100 of its 8 until t=100. research asks 6 more
H100 GPUs, past its cap: it borrows out of product's quota.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.control.platform_builders import PROJECT, two_tenants
from xirang_platform.control import run_tags as rt
from xirang_platform.control import tag_parsing
from xirang_platform.control.accounts import sync_accounts
from xirang_platform.control.platform_config import PlatformConfig
from xirang_platform.control.tick_ledger import write_ledger
from xirang_platform.control.tick_plan import GatedRun, TickPlan, plan_tick
from xirang_platform.dagster_defs.coordinator import Resumption, admission_tags, request_run_tags
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.ledger.preemptions import preemption_records
from xirang_platform.scheduling.model import Request, Tier

LEND_AFTER_S = 600.0
# The tick property test's platform (research 12 GPUs, product 8), a reclaim back-off long enough to see past.
PLATFORM = two_tenants()
CONFIG = replace(PLATFORM, scheduler=replace(PLATFORM.scheduler, reclaim_backoff_s=7200, lend_after_s=LEND_AFTER_S))


def gated(rid: str, tenant: str, tier: Tier, gpus: int, model: str, **reclaim: float) -> GatedRun:
    """A run behind the gate asking `gpus` GPUs of `model`; `reclaimed_at`/`reclaims` as a resumption of
    reclaimed work carries them."""
    request = Request(rid, tenant, PROJECT[tenant], tier, 0.0, gpus=gpus, gpu_models=frozenset({model}))
    request = replace(request, **reclaim)
    return GatedRun(rid, request_run_tags(request) | rt.reclaim_tags(request), tenant)


class Clock:
    """The ledger's clock, which the test moves with the tick's `now`."""

    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    """research at its quota since t=0; product's 4 GPUs released at t=100."""
    ledger = new_ledger(tmp_path, CONFIG)
    runs = [
        gated("research-h100", "research", Tier.ONLINE_TRAINING, 8, "H100-SXM"),
        gated("research-l40s", "research", Tier.ONLINE_TRAINING, 4, "L40S"),
        gated("product-h100", "product", Tier.OFFLINE_TRAINING, 4, "H100-SXM"),
    ]
    plan = tick(ledger, runs, 0.0)
    assert [(ad.request_id, ad.allocation.borrowed) for ad in plan.result.admits] == [(r.run_id, False) for r in runs]
    at(ledger, 100.0)
    ledger.release("product-h100")
    yield ledger
    ledger.close()


def new_ledger(tmp_path: Path, config: PlatformConfig) -> Ledger:
    """An empty ledger on `config`'s accounts, on a `Clock` the test moves."""
    ledger = Ledger(f"sqlite:///{tmp_path}/ledger.sqlite", policy=config.overcommit, clock=Clock())
    sync_accounts(ledger, config.book)
    return ledger


def at(ledger: Ledger, now: float) -> None:
    """Move the ledger's clock to `now`."""
    assert isinstance(ledger.clock, Clock)
    ledger.clock.now = now


def tick(
    ledger: Ledger, runs: list[GatedRun], now: float, from_ledger: bool = True, config: PlatformConfig = CONFIG
) -> TickPlan:
    """What `run_tick` does between reading the gated runs and tagging them: plan, then write the ledger
    (the idle history read as far back as the scheduler asks, `history_s`)."""
    at(ledger, now)
    idle = ledger.idle_history(now - config.scheduler.history_s()) if from_ledger else None
    plan = plan_tick(config.pool, ledger.quota_book(), ledger.allocations(), runs, now, config, idle=idle)
    assert write_ledger(ledger, plan) is None
    return plan


BORROWER = "research-more"
reclaimed_at_50 = {"reclaimed_at": 50.0, "reclaims": 1}  # back-off to t=7,250


@pytest.mark.parametrize(
    ("reclaim", "now", "from_ledger", "held_because"),
    [
        pytest.param({}, 699.0, True, None, id="never reclaimed: borrows at once"),
        pytest.param(
            reclaimed_at_50,
            699.0,
            True,
            "may borrow again from t=7250, or sooner out of quota idle for 600 s (4000 milli now)",
            id="reclaimed: product's 8 GPUs idle only 599 s, 4 lasting",
        ),
        pytest.param(reclaimed_at_50, 700.0, True, None, id="reclaimed: product's 8 GPUs idle 600 s are lent"),
        pytest.param(
            reclaimed_at_50,
            700.0,
            False,
            "may borrow again from t=7250",
            id="reclaimed, no idle history (the tick before the ledger kept it): back-off only",
        ),
    ],
)
def test_a_reclaimed_borrower_gets_lasting_idle_quota_live(
    ledger: Ledger, reclaim: dict[str, float], now: float, from_ledger: bool, held_because: str | None
) -> None:
    run = gated(BORROWER, "research", Tier.OFFLINE_TRAINING, 6, "H100-SXM", **reclaim)
    plan = tick(ledger, [run], now, from_ledger)
    if held_because is None:
        assert [(ad.request_id, ad.allocation.borrowed) for ad in plan.result.admits] == [(BORROWER, True)]
        assert [a.id for a in ledger.allocations() if a.borrowed] == [BORROWER]
    else:
        assert plan.result.admits == ()
        assert held_because in plan.hold_texts[BORROWER]


def test_a_resumption_carries_its_reclaims_from_the_ledger_to_the_tick(tmp_path: Path) -> None:
    ledger = new_ledger(tmp_path, CONFIG)
    victim = gated("v", "research", Tier.OFFLINE_TRAINING, 2, "H100-SXM", reclaimed_at=1234.5, reclaims=2)
    assert [ad.request_id for ad in tick(ledger, [victim], 2000.0).result.admits] == ["v"]
    at(ledger, 5000.0)
    ledger.preempt("v", "product-run", "reclaim")

    record = preemption_records(ledger.engine, ["v", "never-preempted"])
    assert list(record) == ["v"]
    written = admission_tags(
        rt.request_tags(victim.tags),
        "research",
        CONFIG,
        "v-resumed",
        9000.0,
        resumes=Resumption("v", rt.Lineage.of(record["v"].resumed())),
    )
    assert isinstance(written, dict), written
    parsed = tag_parsing.parse(written, "research", run_id="v-resumed")
    assert isinstance(parsed, Request)
    # One more preemption, one more reclaim, reclaimed when the ledger took the units back.
    assert (parsed.submit_time, parsed.preempted, parsed.reclaimed_at, parsed.reclaims) == (0.0, 1, 5000.0, 3)
    assert written[rt.PARENT_RUN] == "v"
    ledger.close()


# The lending forecast live: product serves inference (P0, which preempts at any victim age). It keeps
# 2 H100 GPUs and swings 2 more: released at t=100, back at t=400 (a 300 s dip), released again at
# t=1,000. Checkpoints every 600 s: at t=1,100 the 2 swinging GPUs are forecast back within 200 s,
# before a borrower's first checkpoint, so of the 6 free H100 GPUs 4 are lent.
FORECAST = replace(CONFIG, scheduler=replace(CONFIG.scheduler, checkpoint_interval_s=600.0, lend_forecast_s=3600.0))


def forecast_tick(ledger: Ledger, runs: list[GatedRun], now: float) -> TickPlan:
    """`tick` under FORECAST."""
    return tick(ledger, runs, now, config=FORECAST)


@pytest.fixture
def swinging(tmp_path: Path) -> Iterator[Ledger]:
    ledger = new_ledger(tmp_path, FORECAST)
    base = [
        gated("research-h100", "research", Tier.ONLINE_TRAINING, 8, "H100-SXM"),
        gated("research-l40s", "research", Tier.ONLINE_TRAINING, 4, "L40S"),
        gated("replica-0", "product", Tier.INFERENCE, 2, "H100-SXM"),
    ]
    assert (
        len(
            forecast_tick(
                ledger, [*base, gated("replica-1", "product", Tier.INFERENCE, 2, "H100-SXM")], 0
            ).result.admits
        )
        == 4
    )
    at(ledger, 100.0)
    ledger.release("replica-1")
    assert (
        len(forecast_tick(ledger, [gated("replica-2", "product", Tier.INFERENCE, 2, "H100-SXM")], 400).result.admits)
        == 1
    )
    at(ledger, 1_000.0)
    ledger.release("replica-2")
    yield ledger
    ledger.close()


@pytest.mark.parametrize(
    ("gpus", "now", "held_because"),
    [
        pytest.param(4, 1_100.0, None, id="4 GPUs: what stays idle past a checkpoint"),
        pytest.param(
            6,
            1_100.0,
            "within a checkpoint interval (600 s), before a borrower's first checkpoint (4000 milli lendable",
            id="6 GPUs: 2 of them come back in 200 s",
        ),
        pytest.param(6, 1_300.0, "lendable that long now", id="6 GPUs 300 s on, as long as last time: due back now"),
        pytest.param(6, 1_400.0, None, id="6 GPUs once the swing stayed away longer than it did last time"),
    ],
)
def test_the_tick_lends_only_what_the_forecast_keeps_idle(
    swinging: Ledger, gpus: int, now: float, held_because: str | None
) -> None:
    plan = forecast_tick(swinging, [gated(BORROWER, "research", Tier.OFFLINE_TRAINING, gpus, "H100-SXM")], now)
    if held_because is None:
        assert [(ad.request_id, ad.allocation.borrowed) for ad in plan.result.admits] == [(BORROWER, True)]
    else:
        assert plan.result.admits == ()
        assert held_because in plan.hold_texts[BORROWER]
