"""Random ledger operations (hypothesis strategies) and `apply`, which runs one on a ledger checking
its reserve verdict against the core's `quota.check` and that a refused call changes nothing."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from tests.ledger.ledger_helpers import alloc, dump
from xirang_platform.ledger import Ledger, LedgerError
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.quota import Verdict, check

PROJECTS = [("acme", "vision"), ("acme", "nlp"), ("beta", "web")]
FRACTIONS = st.sampled_from([0.0, 0.5, 0.75, 0.8, 0.9, 1.0])


@dataclass(frozen=True)
class Reserve:
    project: int
    tier: Tier
    gpus: int
    milli: int
    fraction: float


@dataclass(frozen=True)
class OnLive:
    """commit / release / preempt the `pick`-th live allocation (modulo how many there are)."""

    action: str
    pick: int
    fraction: float


@dataclass(frozen=True)
class Batch:
    """reserve_allocations / commit_many / release_many in one transaction."""

    action: str
    picks: tuple[int, ...]
    reserves: tuple[Reserve, ...] = ()


@dataclass(frozen=True)
class SetQuota:
    project: int
    quota: int | None


@dataclass(frozen=True)
class ReturnBorrowed:
    tenant: str
    fraction: float


reserves = st.builds(
    Reserve,
    st.integers(0, len(PROJECTS) - 1),
    st.sampled_from(list(Tier)),
    st.integers(1, 3),
    st.sampled_from([250, 500, 1000]),
    FRACTIONS,
).map(lambda r: r if r.milli == 1000 else Reserve(r.project, r.tier, 1, r.milli, r.fraction))
on_live = st.builds(
    OnLive, st.sampled_from(["commit", "release", "preempt", "commit", "release"]), st.integers(0, 50), FRACTIONS
)
set_quota = st.builds(
    SetQuota, st.integers(0, len(PROJECTS) - 1), st.one_of(st.none(), st.integers(0, 8).map(lambda g: g * 500))
)
returns = st.builds(ReturnBorrowed, st.sampled_from(["acme", "beta"]), FRACTIONS)
batches = st.builds(
    Batch,
    st.sampled_from(["reserve", "commit", "release"]),
    st.lists(st.integers(0, 50), min_size=1, max_size=4).map(tuple),
    st.lists(reserves, min_size=1, max_size=4).map(tuple),
)
operations = st.lists(
    st.one_of(reserves, reserves, on_live, on_live, batches, set_quota, returns), min_size=3, max_size=24
)


def setup(ledger: Ledger) -> None:
    """The accounts `PROJECTS` names: acme (3 GPUs; vision 2, nlp without a quota), beta (1 GPU; web 1)."""
    ledger.add_tenant("acme", 3000)
    ledger.add_project("acme", "vision", 2000)
    ledger.add_project("acme", "nlp")
    ledger.add_tenant("beta", 1000)
    ledger.add_project("beta", "web", 1000)


def apply(ledger: Ledger, op: object, step: int) -> None:
    """Run one operation, checking the reserve verdict against the core and refusals against the tables."""
    if isinstance(op, Reserve):
        tenant, project = PROJECTS[op.project]
        admitted = alloc(f"r{step}", tenant, project, op.tier, op.gpus, op.milli)
        book, before = ledger.snapshot()
        want = check(book, before, admitted.request, ledger.policy.ratio(op.fraction), admitted.milli).verdict
        got = ledger.reserve(admitted, op.fraction)
        assert got.verdict == want
        assert got.admitted == (want in (Verdict.IN_QUOTA, Verdict.BORROW))
        return
    if isinstance(op, OnLive):
        live = ledger.allocations()
        if not live:
            return
        victim = live[op.pick % len(live)]
        snapshot = dump(ledger)
        try:
            if op.action == "commit":
                ledger.commit(victim.id)
            elif op.action == "release":
                ledger.release(victim.id, allocated_fraction=op.fraction)
            else:
                ledger.preempt(victim.id, by="someone", allocated_fraction=op.fraction)
        except LedgerError:
            # Refused (a double commit, a P0 or in-quota P1 victim): nothing changed.
            assert dump(ledger) == snapshot
        return
    if isinstance(op, Batch):
        snapshot = dump(ledger)
        if op.action == "reserve":
            admitted = [
                alloc(f"r{step}-{i}", *PROJECTS[r.project], r.tier, r.gpus, r.milli) for i, r in enumerate(op.reserves)
            ]
            got = ledger.reserve_allocations(admitted, op.reserves[0].fraction)
            assert [g.request_id for g in got] == [a.id for a in admitted]
            return
        live = ledger.allocations()
        ids = [live[p % len(live)].id for p in op.picks] if live else ["never-reserved"]
        try:
            if op.action == "commit":
                ledger.commit_many(ids)
            else:
                ledger.release_many(ids)
        except LedgerError:
            # A double commit or release (also one inside the batch): the whole batch changed nothing.
            assert dump(ledger) == snapshot
        return
    if isinstance(op, SetQuota):
        tenant, project = PROJECTS[op.project]
        snapshot = dump(ledger)
        try:
            ledger.set_project_quota(tenant, project, op.quota)
        except LedgerError:
            assert dump(ledger) == snapshot
        return
    assert isinstance(op, ReturnBorrowed)
    ledger.return_borrowed(op.tenant, op.fraction)
