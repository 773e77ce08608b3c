"""Tenants, projects and quotas: what the ledger stores, the core objects it builds, and refusals
that leave it byte-for-byte unchanged. Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.ledger.ledger_helpers import alloc, dump
from xirang_platform.base.user_input import MAX_QUOTA_MILLI
from xirang_platform.ledger import Ledger, LedgerError
from xirang_platform.ledger.errors import (
    AlreadyExists,
    InvalidAmount,
    InvalidName,
    InvalidTransition,
    PreemptForbidden,
    ProjectInOtherTenant,
    QuotaExceedsTenant,
    UnknownAllocation,
    UnknownProject,
    UnknownTenant,
)
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.quota import AccountKey, Balance, QuotaBook


def acme(ledger: Ledger) -> Ledger:
    """acme (8 GPUs) with vision (4 GPUs) and nlp (no quota of its own); other (2 GPUs) with web."""
    ledger.add_tenant("acme", 8000)
    ledger.add_project("acme", "vision", 4000)
    ledger.add_project("acme", "nlp")
    ledger.add_tenant("other", 2000)
    ledger.add_project("other", "web", 1000)
    return ledger


def test_quota_book_and_balances_are_the_core_objects(ledger: Ledger) -> None:
    acme(ledger)
    ledger.reserve(alloc("r1", gpus=2))
    ledger.commit("r1")
    ledger.reserve(alloc("r2", project="nlp", milli=500))

    assert ledger.quota_book() == QuotaBook(
        {"acme": 8000, "other": 2000},
        {("acme", "vision"): 4000, ("acme", "nlp"): None, ("other", "web"): 1000},
    )
    # nlp has no quota of its own: the core does not charge it, so it has no balance there.
    assert ledger.balances() == {
        AccountKey("acme"): Balance(8000, used=2000, reserved=500),
        AccountKey("acme", "vision"): Balance(4000, used=2000),
        AccountKey("other"): Balance(2000),
        AccountKey("other", "web"): Balance(1000),
    }


def test_project_quota_may_be_changed_and_removed(ledger: Ledger) -> None:
    acme(ledger)
    ledger.set_project_quota("acme", "nlp", 3000)
    ledger.set_project_quota("acme", "vision", None)
    ledger.set_tenant_quota("acme", 6000)

    assert ledger.quota_book().projects[("acme", "nlp")] == 3000
    assert ledger.quota_book().projects[("acme", "vision")] is None
    assert ledger.quota_book().tenants["acme"] == 6000
    assert [(e.account, e.amount, e.details["quota"]) for e in ledger.entries(kind="quota")][-3:] == [
        ("acme/nlp", 3000, 3000),
        ("acme/vision", -4000, None),
        ("acme", -2000, 6000),
    ]
    assert ledger.rebuild().ok


def test_project_quotas_may_sum_to_tenant_quota_times_max_ratio(ledger: Ledger) -> None:
    acme(ledger)
    # 8 GPUs x 1.2 = 9.6 GPUs for all of acme's projects: vision 4 + nlp 5.6 fits exactly.
    ledger.set_project_quota("acme", "nlp", 5600)
    assert ledger.quota_book().projects[("acme", "nlp")] == 5600


def test_project_quota_past_tenant_cap_is_refused_saying_by_how_much(ledger: Ledger) -> None:
    acme(ledger)
    before = dump(ledger)
    # vision 4 + nlp 6 = 10 GPUs; acme allows 8 x 1.2 = 9.6: 0.4 GPUs too many; 10 / 1.2 -> 8.334.
    with pytest.raises(QuotaExceedsTenant, match=r"sum to 10 GPUs, 0.4 GPUs more than .* 9.6 GPUs") as err:
        ledger.set_project_quota("acme", "nlp", 6000)
    assert "`xirang quota tenant set acme --quota 8.334`" in str(err.value)
    assert dump(ledger) == before


def test_lowering_tenant_quota_under_its_projects_is_refused(ledger: Ledger) -> None:
    acme(ledger)
    before = dump(ledger)
    with pytest.raises(QuotaExceedsTenant, match=r"0.4 GPUs more"):
        ledger.set_tenant_quota("acme", 3000)  # 3 x 1.2 = 3.6 < vision's 4
    assert dump(ledger) == before


BAD_CALLS: list = [
    pytest.param(lambda led: led.add_tenant("acme", 1000), AlreadyExists, "tenant set acme", id="tenant added twice"),
    pytest.param(lambda led: led.add_tenant("new", -1000), InvalidAmount, "must not be negative", id="negative quota"),
    pytest.param(lambda led: led.add_tenant("new", "8"), InvalidAmount, "whole number", id="non-numeric quota"),
    pytest.param(lambda led: led.add_tenant("new", 1.5), InvalidAmount, "whole number", id="fractional milli"),
    pytest.param(lambda led: led.add_tenant("a/b", 1000), InvalidName, "no '/'", id="slash in tenant name"),
    # issue 10, items 3 and 7: one rule for names and quotas, within what both databases store.
    pytest.param(lambda led: led.add_tenant("Acme", 1000), InvalidName, "lower-case", id="upper-case twin of a tenant"),
    pytest.param(
        lambda led: led.add_tenant("it's", 1000), InvalidName, "invalid tenant name", id="quote in tenant name"
    ),
    pytest.param(
        lambda led: led.add_project("acme", "Vision", 1000), InvalidName, "write 'vision'", id="upper-case project name"
    ),
    pytest.param(
        lambda led: led.add_tenant("new", MAX_QUOTA_MILLI + 1), InvalidAmount, "1,000,000 GPUs", id="quota too large"
    ),
    pytest.param(
        lambda led: led.set_project_quota("acme", "vision", 10**30), InvalidAmount, "1,000,000 GPUs", id="huge quota"
    ),
    pytest.param(
        lambda led: led.set_tenant_quota("ghost", 1000), UnknownTenant, "tenant add ghost", id="set unknown tenant"
    ),
    pytest.param(
        lambda led: led.add_project("ghost", "p", 1000),
        UnknownTenant,
        "tenant add ghost",
        id="project in unknown tenant",
    ),
    pytest.param(
        lambda led: led.add_project("other", "vision", 500),
        ProjectInOtherTenant,
        "belongs to tenant 'acme'",
        id="project in two tenants",
    ),
    pytest.param(
        lambda led: led.add_project("acme", "vision", 500),
        AlreadyExists,
        "project set acme vision",
        id="project added twice",
    ),
    pytest.param(
        lambda led: led.add_project("acme", "p", -5), InvalidAmount, "must not be negative", id="negative project quota"
    ),
    pytest.param(
        lambda led: led.set_project_quota("acme", "ghost", 1000),
        UnknownProject,
        "project add acme ghost",
        id="set unknown project",
    ),
    pytest.param(
        lambda led: led.set_project_quota("other", "vision", 1000),
        UnknownProject,
        "unknown project 'vision' in tenant 'other'",
        id="set project of other tenant",
    ),
    pytest.param(
        lambda led: led.reserve(alloc("x", tenant="ghost")),
        UnknownTenant,
        "tenant add ghost",
        id="reserve unknown tenant",
    ),
    pytest.param(
        lambda led: led.reserve(alloc("x", project="ghost")),
        UnknownProject,
        "project add acme ghost",
        id="reserve unknown project",
    ),
    pytest.param(lambda led: led.reserve(alloc("held")), InvalidTransition, "already reserved", id="reserve twice"),
    pytest.param(lambda led: led.reserve(alloc("x"), 1.5), InvalidAmount, "in 0..1", id="allocated fraction past 1"),
    pytest.param(lambda led: led.reserve(alloc("x" * 201)), InvalidName, "1-200 characters", id="request id too long"),
    pytest.param(
        lambda led: led.release("held", cause="c" * 65), InvalidName, "longer than 64", id="release cause too long"
    ),
    pytest.param(lambda led: led.release("never"), UnknownAllocation, "never reserved", id="release never reserved"),
    pytest.param(lambda led: led.release("done"), UnknownAllocation, "already released", id="release twice"),
    pytest.param(lambda led: led.commit("never"), UnknownAllocation, "never reserved", id="commit never reserved"),
    pytest.param(lambda led: led.commit("running"), InvalidTransition, "commit each launch once", id="double commit"),
    pytest.param(
        lambda led: led.preempt("serving", by="x"), PreemptForbidden, "never preempted", id="preempt inference"
    ),
    pytest.param(
        lambda led: led.preempt("held", by="x", reason="whim"), LedgerError, "priority, reclaim", id="unknown reason"
    ),
    pytest.param(
        lambda led: led.return_borrowed("ghost"), UnknownTenant, "tenant add ghost", id="return for unknown tenant"
    ),
    pytest.param(
        lambda led: led.entries(kind="refund"), LedgerError, "use one of reserve", id="history of unknown kind"
    ),
]


@pytest.mark.parametrize(("call", "error", "message"), BAD_CALLS)
def test_bad_input_is_refused_clearly_and_changes_nothing(
    ledger: Ledger, call: Callable[[Ledger], object], error: type[Exception], message: str
) -> None:
    acme(ledger)
    ledger.reserve(alloc("held"))
    ledger.reserve(alloc("running"))
    ledger.commit("running")
    ledger.reserve(alloc("done"))
    ledger.release("done")
    ledger.reserve(alloc("serving", tier=Tier.INFERENCE))
    before = dump(ledger)

    with pytest.raises(error, match=message):
        call(ledger)

    assert dump(ledger) == before
    assert ledger.rebuild().ok


def test_the_largest_quota_fits_every_column_on_both_databases(ledger: Ledger) -> None:
    """MAX_QUOTA_GPUS is chosen so that the quota and its cap (x 1.2) fit a 32-bit integer column."""
    ledger.add_tenant("big", MAX_QUOTA_MILLI)
    ledger.add_project("big", "all", MAX_QUOTA_MILLI)
    ledger.add_project("big", "more", MAX_QUOTA_MILLI // 5)  # projects sum to the tenant's cap
    ledger.reserve(alloc("r", tenant="big", project="all", gpus=8))
    assert ledger.quota_book().tenants == {"big": MAX_QUOTA_MILLI}
    assert [v.cap(ledger.policy.max_ratio) for v in ledger.accounts()][0] == MAX_QUOTA_MILLI * 6 // 5
    assert ledger.rebuild().ok
