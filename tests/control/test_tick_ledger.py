"""The tick's ledger step (`control/tick_ledger.reserve`): what is written when the ledger refuses
a request on its own account, and when it refuses the cycle.

Plans come from the real `plan_tick` on the tests' pool (two 8-GPU H100 servers, one 4 x L40S);
`write` stands for `write_ledger`, refusing the requests a case names, as the ledger does."""

from __future__ import annotations

from collections.abc import Callable, Set

import pytest

from tests.control.platform_builders import gated, two_tenants
from xirang_platform.control.tick_ledger import MAX_REFUSED_PER_TICK, reserve
from xirang_platform.control.tick_plan import GatedRun, TickPlan, plan_tick
from xirang_platform.ledger.errors import BadRequest, OverCapacity, RequestRefused
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.model import Tier

CONFIG = two_tenants(llm_quota_gpus=4)
RUNS = [gated(f"r{i}", "research", "llm", Tier.OFFLINE_TRAINING, 1) for i in range(10)]


def planner(runs: list[GatedRun]) -> tuple[TickPlan, Callable[[Set[str], CycleMemo | None], TickPlan], list[Set[str]]]:
    """The first plan over `runs`, the replan the tick hands `reserve`, and the refusals each replan saw."""
    asked: list[Set[str]] = []

    def replan(refused: Set[str], memo: CycleMemo | None) -> TickPlan:
        asked.append(set(refused))
        rest = [r for r in runs if r.run_id not in refused]
        return plan_tick(CONFIG.pool, CONFIG.book, [], rest, 100.0, CONFIG, memo)

    return plan_tick(CONFIG.pool, CONFIG.book, [], runs, 100.0, CONFIG), replan, asked


class RefusingWrite:
    """A write that refuses, once each, the admitted requests `refuse` picks, and records what it wrote."""

    def __init__(self, refuse: Callable[[TickPlan], RequestRefused | None], answer: str | None = None) -> None:
        self.refuse = refuse
        self.answer = answer
        self.written: list[TickPlan] = []

    def write(self, plan: TickPlan) -> str | None:
        refusal = self.refuse(plan)
        if refusal is not None:
            raise refusal
        self.written.append(plan)
        return self.answer


def refuses(run_id: str, kind: type[RequestRefused]) -> Callable[[TickPlan], RequestRefused | None]:
    def refuse(plan: TickPlan) -> RequestRefused | None:
        return kind(run_id, f"{run_id} cannot be held") if plan.result.admitted(run_id) else None

    return refuse


def first_admitted(plan: TickPlan) -> RequestRefused | None:
    admits = sorted(ad.request_id for ad in plan.result.admits)
    return OverCapacity(admits[0], "no room after all") if admits else None


@pytest.mark.parametrize(
    ("kind", "fails"),
    [
        pytest.param(BadRequest, True, id="a request the ledger can never hold fails its run"),
        pytest.param(OverCapacity, False, id="a request the snapshot was wrong about waits with the reason"),
    ],
)
def test_a_refused_request_is_left_out_and_the_rest_written(kind: type[RequestRefused], fails: bool) -> None:
    plan, replan, asked = planner(RUNS[:3])
    ledger = RefusingWrite(refuses("r1", kind))
    reserved = reserve(plan, ledger.write, replan)
    assert reserved.stale is None
    assert asked == [{"r1"}]
    assert [sorted(ad.request_id for ad in p.result.admits) for p in ledger.written] == [["r0", "r2"]]
    assert sorted(ad.request_id for ad in reserved.plan.result.admits) == ["r0", "r2"]
    reason = "ledger: r1 cannot be held"
    assert (reserved.plan.failures.get("r1"), reserved.plan.hold_texts.get("r1")) == (
        (reason, None) if fails else (None, reason)
    )


def test_past_the_limit_of_refusals_nothing_is_written_and_the_next_tick_decides() -> None:
    plan, replan, asked = planner(RUNS)
    ledger = RefusingWrite(first_admitted)
    reserved = reserve(plan, ledger.write, replan)
    assert len(asked) == MAX_REFUSED_PER_TICK  # a plan per refusal but the last
    assert ledger.written == []
    assert reserved.stale == (
        f"the ledger refused {MAX_REFUSED_PER_TICK + 1} requests in one tick; the next tick decides again"
    )
    assert (reserved.plan.result.admits, reserved.plan.result.preempts) == ((), ())
    refused = {f"r{i}" for i in range(MAX_REFUSED_PER_TICK + 1)}
    assert set(reserved.plan.hold_texts) == refused  # each waits with the ledger's reason
    assert reserved.memo is not None


def test_a_cycle_the_ledger_refuses_whole_leaves_only_its_holds_and_keeps_the_memo() -> None:
    plan, replan, asked = planner(RUNS[:2])
    ledger = RefusingWrite(lambda _: None, answer="the ledger changed since the snapshot")
    reserved = reserve(plan, ledger.write, replan)
    assert reserved.stale == "the ledger changed since the snapshot"
    assert asked == []
    assert reserved.plan.result.admits == ()
    assert reserved.plan.result.holds == plan.result.holds
    assert reserved.memo is plan.result.memo


def test_a_plan_the_ledger_takes_is_returned_as_it_was() -> None:
    plan, replan, asked = planner(RUNS[:2])
    reserved = reserve(plan, RefusingWrite(lambda _: None).write, replan)
    assert reserved == (plan, plan.result.memo, None)
    assert asked == []
