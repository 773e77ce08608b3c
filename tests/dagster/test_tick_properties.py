"""Property: over several ticks of random runs from two tenants, the tick's pure plan step and its
one-transaction ledger write keep the ledger's invariants (DESIGN.md section 6): no GPU over-allocated,
in-quota holdings within the cap, balances equal to their entries, every admission placed once."""

from __future__ import annotations

import itertools
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.control.platform_builders import PROJECT, two_tenants
from xirang_platform.control import run_tags as rt
from xirang_platform.control.accounts import sync_accounts
from xirang_platform.control.tick_ledger import write_ledger
from xirang_platform.control.tick_plan import GatedRun, plan_tick
from xirang_platform.dagster_defs.coordinator import request_run_tags
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.snapshot import Snapshot

CONFIG = two_tenants()

asks = st.tuples(
    st.sampled_from(["research", "product"]),
    st.sampled_from(list(Tier)),
    st.one_of(st.integers(1, 8).map(lambda g: (g, 1000)), st.sampled_from([125, 250, 500]).map(lambda m: (1, m))),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ticks=st.lists(st.tuples(st.lists(asks, max_size=6), st.integers(0, 3)), min_size=2, max_size=5))
def test_ticks_keep_the_ledger_invariants(ticks: list[tuple[list[tuple[str, Tier, tuple[int, int]]], int]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(f"sqlite:///{tmp}/ledger.sqlite", policy=CONFIG.overcommit)
        sync_accounts(ledger, CONFIG.book)
        waiting: dict[str, GatedRun] = {}
        ids = itertools.count()
        memo = None
        for t, (arrivals, finishing) in enumerate(ticks):
            now = 100.0 * (t + 1)
            for tenant, tier, (gpus, milli) in arrivals:
                rid = f"run-{next(ids)}"
                request = Request(rid, tenant, PROJECT[tenant], tier, now, gpus=gpus, milli_per_gpu=milli)
                waiting[rid] = GatedRun(rid, request_run_tags(request), tenant)
            for a in ledger.allocations()[:finishing]:
                ledger.release(a.id, "finished")
            held = ledger.allocations()
            plan = plan_tick(CONFIG.pool, ledger.quota_book(), held, list(waiting.values()), now, CONFIG, memo)
            plain = plan_tick(CONFIG.pool, ledger.quota_book(), held, list(waiting.values()), now, CONFIG)
            assert (plan.result, plan.failures, plan.hold_texts) == (plain.result, plain.failures, plain.hold_texts)
            memo = plan.result.memo  # the previous tick's, as the sensor hands it on
            assert write_ledger(ledger, plan) is None
            if t == 0 and arrivals:  # any one ask fits the empty pool within its tenant's cap
                assert plan.result.admits
            for ad in plan.result.admits:
                del waiting[ad.request_id]
            for p in plan.result.preempts:  # the victim's resumption waits again, marked preempted
                tags = request_run_tags(p.victim.request) | {rt.PREEMPTED: str(p.victim.request.preempted + 1)}
                waiting[p.victim.id] = GatedRun(p.victim.id, tags, p.victim.request.tenant)
            for rid in plan.failures:
                waiting.pop(rid, None)

            live = ledger.allocations()
            assert len({a.id for a in live}) == len(live)
            assert not set(waiting) & {a.id for a in live}
            snapshot = Snapshot.build(CONFIG.pool, live, ledger.quota_book())
            assert snapshot.state.check() == []
            balances = quota.balances_from(snapshot.book, live)
            for key, b in balances.items():
                assert b.in_quota <= quota.cap(b.quota, CONFIG.overcommit.max_ratio), key
            assert ledger.rebuild().ok
        ledger.close()
