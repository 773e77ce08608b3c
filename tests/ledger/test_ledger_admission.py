"""Reserve, commit, release, borrow, return and preempt: balances, entries and the cap rules.
Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from tests.ledger.ledger_helpers import alloc, dump
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.errors import InvalidTransition, UnknownAllocation
from xirang_platform.ledger.rebuild import Difference, cap_violations
from xirang_platform.ledger.tables import ACCOUNTS
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.quota import AccountKey, Balance, Verdict

ACME = AccountKey("acme")
VISION = AccountKey("acme", "vision")


def tenant(ledger: Ledger, quota: int = 4000, project_quota: int | None = None) -> Ledger:
    """acme with `quota` milli and one project, vision (`project_quota`; None = no limit of its own)."""
    ledger.add_tenant("acme", quota)
    ledger.add_project("acme", "vision", project_quota)
    return ledger


def test_reserve_commit_release_moves_reserved_to_used_to_nothing(ledger: Ledger) -> None:
    tenant(ledger, project_quota=4000)
    r = ledger.reserve(alloc("a", gpus=2))
    assert (r.admitted, r.verdict, r.borrowed) == (True, Verdict.IN_QUOTA, False)
    assert ledger.balances()[VISION] == Balance(4000, reserved=2000)
    ledger.commit("a")
    assert ledger.balances()[VISION] == Balance(4000, used=2000)
    ledger.release("a")
    assert ledger.balances() == {ACME: Balance(4000), VISION: Balance(4000)}
    kinds = [(e.kind, e.account, e.bucket, e.amount) for e in ledger.entries() if e.kind != "quota"]
    assert kinds == [
        ("reserve", "acme", "reserved", 2000),
        ("reserve", "acme/vision", "reserved", 2000),
        ("commit", "acme", "reserved", -2000),
        ("commit", "acme", "used", 2000),
        ("commit", "acme/vision", "reserved", -2000),
        ("commit", "acme/vision", "used", 2000),
        ("release", "acme", "used", -2000),
        ("release", "acme/vision", "used", -2000),
    ]
    assert ledger.rebuild().ok


@pytest.mark.parametrize(
    ("tier", "gpus", "want_verdict", "want_balance"),
    [
        # quota 4 GPUs x 1.2 = cap 4.8 GPUs: 4 fit in-quota, 5 do not.
        pytest.param(Tier.INFERENCE, 4, Verdict.IN_QUOTA, Balance(4000, reserved=4000), id="P0 up to the cap"),
        pytest.param(Tier.INFERENCE, 5, Verdict.OVER_QUOTA, Balance(4000), id="P0 past the cap is refused"),
        pytest.param(Tier.ONLINE_TRAINING, 5, Verdict.BORROW, Balance(4000, borrowed=5000), id="P1 past cap borrows"),
        pytest.param(Tier.BATCH_INFERENCE, 5, Verdict.BORROW, Balance(4000, borrowed=5000), id="P2 past cap borrows"),
    ],
)
def test_cap_decides_in_quota_borrow_or_refuse(
    ledger: Ledger, tier: Tier, gpus: int, want_verdict: Verdict, want_balance: Balance
) -> None:
    tenant(ledger)
    r = ledger.reserve(alloc("a", tier=tier, gpus=gpus))
    assert r.verdict == want_verdict
    assert r.admitted == (want_verdict is not Verdict.OVER_QUOTA)
    assert ledger.balances()[ACME] == want_balance


def test_refused_reservation_writes_nothing_and_says_why(ledger: Ledger) -> None:
    tenant(ledger)
    count = len(ledger.entries())
    r = ledger.reserve(alloc("a", tier=Tier.INFERENCE, gpus=5))
    assert r.allocation_id is None
    assert "acme would be 200 milli past its cap of 4800" in r.message  # 5000 - 4000 x 1.2
    assert len(ledger.entries()) == count
    assert ledger.allocations() == []


def test_no_idle_units_turns_a_borrow_into_a_refusal(ledger: Ledger) -> None:
    tenant(ledger)
    r = ledger.reserve(alloc("a", gpus=5), allow_borrow=False)
    assert (r.admitted, r.verdict) == (False, Verdict.OVER_QUOTA)
    assert "no idle units" in r.message


@pytest.mark.parametrize(
    ("fraction", "want_cap"),
    [
        pytest.param(0.0, 4800, id="idle cluster: ratio 1.2"),
        pytest.param(0.70, 4800, id="at the low threshold: still 1.2"),
        pytest.param(0.80, 4400, id="halfway: ratio 1.1"),
        pytest.param(0.95, 4000, id="past the high threshold: ratio 1.0"),
    ],
)
def test_cap_follows_cluster_allocation(ledger: Ledger, fraction: float, want_cap: int) -> None:
    tenant(ledger)
    assert ledger.reserve(alloc("base", tier=Tier.INFERENCE, gpus=4), fraction).admitted
    if want_cap > 4000:
        assert ledger.reserve(alloc("fits", tier=Tier.INFERENCE, milli=want_cap - 4000), fraction).admitted
    assert not ledger.reserve(alloc("over", tier=Tier.INFERENCE, milli=1), fraction).admitted
    assert ledger.balances()[ACME].reserved == want_cap


def test_project_cap_binds_inside_a_roomy_tenant(ledger: Ledger) -> None:
    tenant(ledger, quota=8000, project_quota=1000)
    r = ledger.reserve(alloc("a", tier=Tier.INFERENCE, gpus=2))  # vision cap 1.2 GPUs
    assert r.verdict is Verdict.OVER_QUOTA
    assert "acme/vision" in r.message


def test_project_without_quota_is_counted_but_not_capped(ledger: Ledger) -> None:
    tenant(ledger, quota=8000, project_quota=None)
    ledger.reserve(alloc("a", tier=Tier.INFERENCE, gpus=9))
    views = {v.key: v for v in ledger.accounts()}
    assert views[VISION].reserved == 9000
    assert views[VISION].cap(1.2) is None
    assert views[ACME].headroom(1.2) == 600  # 8 x 1.2 = 9.6 - 9


def test_release_returns_borrowed_allocations_oldest_first(ledger: Ledger) -> None:
    tenant(ledger, quota=2000)  # cap 2.4 GPUs
    ledger.reserve(alloc("base", gpus=2))
    ledger.commit("base")
    for start, rid in enumerate(("old", "mid", "new")):  # each 1 GPU, past the cap: borrowed
        assert ledger.reserve(alloc(rid, start=start)).borrowed
    ledger.commit("mid")
    # base leaves: 2.4 GPUs of room, so old and mid return (2 GPUs); new would reach 3 > 2.4.
    assert ledger.release("base") == ["old", "mid"]
    assert ledger.balances()[ACME] == Balance(2000, used=1000, reserved=1000, borrowed=1000)
    returns = [(e.request_id, e.bucket, e.amount) for e in ledger.entries(kind="return", project="vision")]
    assert returns == [
        ("old", "borrowed", -1000),
        ("old", "reserved", 1000),
        ("mid", "borrowed", -1000),
        ("mid", "used", 1000),
    ]
    assert {a.id: a.borrowed for a in ledger.allocations()} == {"old": False, "mid": False, "new": True}
    assert ledger.rebuild().ok


def test_return_waits_for_room_under_the_cap(ledger: Ledger) -> None:
    tenant(ledger, quota=1000)
    ledger.reserve(alloc("base", tier=Tier.INFERENCE))
    ledger.reserve(alloc("lent"))  # 2 GPUs > cap 1.2: borrowed
    assert ledger.return_borrowed("acme") == []
    ledger.release("base", auto_return=False)
    assert ledger.balances()[ACME] == Balance(1000, borrowed=1000)
    assert ledger.return_borrowed("acme") == ["lent"]
    assert ledger.balances()[ACME] == Balance(1000, reserved=1000)


def test_commit_of_borrowed_allocation_keeps_it_borrowed(ledger: Ledger) -> None:
    tenant(ledger, quota=0)
    ledger.reserve(alloc("a"))
    ledger.commit("a")
    assert ledger.balances()[ACME] == Balance(0, borrowed=1000)
    assert ledger.allocations()[0].confirmed
    ledger.release("a")
    assert ledger.balances()[ACME] == Balance(0)


def test_preempt_records_victim_preemptor_and_reason(ledger: Ledger) -> None:
    tenant(ledger)
    ledger.reserve(alloc("victim", gpus=2))
    ledger.commit("victim")
    ledger.preempt("victim", by="urgent", reason="reclaim")
    entries = ledger.entries(kind="preempt")
    assert [(e.account, e.request_id, e.cause, e.details, e.amount) for e in entries] == [
        ("acme", "victim", "reclaim", {"by": "urgent", "reason": "reclaim"}, -2000),
        ("acme/vision", "victim", "reclaim", {"by": "urgent", "reason": "reclaim"}, -2000),
    ]
    assert ledger.allocations() == []
    # A preempted request resumes under its own id.
    assert ledger.reserve(alloc("victim", gpus=2)).admitted


def test_preempt_of_p1_is_only_for_its_borrowed_part(ledger: Ledger) -> None:
    tenant(ledger, quota=1000)
    ledger.reserve(alloc("in-quota", tier=Tier.ONLINE_TRAINING))
    ledger.reserve(alloc("borrowed", tier=Tier.ONLINE_TRAINING))
    with pytest.raises(Exception, match="only for its borrowed part"):
        ledger.preempt("in-quota", by="x")
    ledger.preempt("borrowed", by="x")
    assert [a.id for a in ledger.allocations()] == ["in-quota"]


def test_rebuild_reports_a_balance_that_disagrees_with_its_entries(ledger: Ledger) -> None:
    tenant(ledger)
    ledger.reserve(alloc("a", gpus=2))
    with ledger.engine.begin() as conn:
        conn.execute(update(ACCOUNTS).where(ACCOUNTS.c.key == "acme").values(reserved=1500))
    report = ledger.rebuild()
    assert not report.ok
    assert report.differences == [Difference("acme", "reserved", stored=1500, from_entries=2000)]


def test_every_admission_in_the_log_respects_the_cap_it_was_made_under(ledger: Ledger) -> None:
    tenant(ledger, quota=3000, project_quota=2000)
    held = []
    for i, fraction in enumerate([0.0, 0.8, 0.95, 0.5, 0.0, 0.85, 0.9, 0.0]):
        for r in (alloc(f"p0-{i}", tier=Tier.INFERENCE, milli=700), alloc(f"p2-{i}", milli=900)):
            if ledger.reserve(r, fraction).admitted:
                held.append(r.id)
        if i % 3 == 2:
            ledger.release(held.pop(0), allocated_fraction=fraction)
    assert len(ledger.entries(kind="return")) > 0
    assert len(ledger.entries(kind="borrow")) > 0
    assert cap_violations(ledger.entries()) == []


def test_reserve_many_decides_each_on_the_balances_the_ones_before_left(ledger: Ledger) -> None:
    tenant(ledger)  # cap 4.8 GPUs
    got = ledger.reserve_allocations(
        [alloc("a", tier=Tier.INFERENCE, gpus=3), alloc("b", tier=Tier.INFERENCE, gpus=2), alloc("c", gpus=2)]
    )
    # a: 3 <= 4.8 in-quota; b: 3 + 2 = 5 > 4.8, P0 refused; c: P2 borrows.
    assert [(r.request_id, r.verdict) for r in got] == [
        ("a", Verdict.IN_QUOTA),
        ("b", Verdict.OVER_QUOTA),
        ("c", Verdict.BORROW),
    ]
    ops = {e.op for e in ledger.entries() if e.kind != "quota"}
    assert len(ops) == 1  # one transaction
    ledger.commit_many(["a", "c"])
    # a's release makes room: borrowed c turns in-quota before it is released in turn.
    assert ledger.release_many(["a", "c"]) == ["c"]
    assert ledger.balances()[ACME] == Balance(4000)
    assert ledger.rebuild().ok


def test_batch_with_one_bad_item_changes_nothing(ledger: Ledger) -> None:
    tenant(ledger)
    ledger.reserve(alloc("held"))
    before = dump(ledger)
    with pytest.raises(InvalidTransition, match="'held' is already reserved"):
        ledger.reserve_allocations([alloc("new"), alloc("held")])
    with pytest.raises(InvalidTransition, match="'twin' is already reserved"):
        ledger.reserve_allocations([alloc("twin"), alloc("twin")])
    with pytest.raises(UnknownAllocation, match="cannot release request 'ghost'"):
        ledger.release_many(["held", "ghost"])
    assert dump(ledger) == before
