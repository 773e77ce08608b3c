"""An elastic run's resize in the ledger (DESIGN.md sections 6 and 11): the `resize` entries with the
old and new size, written with the balances in the cycle's transaction, the placement replaced, the
balances rebuilt from history, and a resize the ledger cannot do as made refused whole. Every test
runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.ledger.ledger_helpers import dump
from xirang_platform.ledger import Ledger
from xirang_platform.ledger.errors import InvalidPlacement, StaleCycle
from xirang_platform.ledger.preemptions import claim_resumption, preemption_records
from xirang_platform.ledger.rebuild import balances_from_entries, cap_violations
from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.model import (
    Admit,
    Allocation,
    GpuRange,
    GpuSlice,
    NodeShare,
    Placement,
    PreemptReason,
    Request,
    Resize,
    ResizeKind,
    Tier,
)
from xirang_platform.scheduling.result import CycleResult

H100 = GpuModel("H100", 81559, 989)
POOL = Pool((Node("n0", H100, 8, 64_000, 512_000, "d0"), Node("n1", H100, 8, 64_000, 512_000, "d0")))
RANGE = GpuRange(2, 8, 2)


def elastic(rid: str, gpus: int, *, borrowed: bool = False, first_gpu: int = 0, tenant: str = "acme") -> Allocation:
    """An elastic offline-training allocation of `tenant`/vision, range 2..8 step 2, on GPUs
    `first_gpu`.. of n0, as a cycle returns it (unconfirmed)."""
    request = Request(rid, tenant, "vision", Tier.OFFLINE_TRAINING, submit_time=0.0, gpus=gpus, elastic=RANGE)
    slices = tuple(GpuSlice("n0", g, 1000) for g in range(first_gpu, first_gpu + gpus))
    placement = Placement(slices, (NodeShare("n0", 0, 0),))
    return Allocation(request, placement, start=0.0, borrowed=borrowed, confirmed=False)


def resized(old: Allocation, gpus: int, kind: ResizeKind, *, borrowed: bool | None = None, **kw: object) -> CycleResult:
    """A cycle that resizes `old` to `gpus` (its borrowed flag kept unless given)."""
    new = elastic(old.id, gpus, borrowed=old.borrowed if borrowed is None else borrowed)
    return CycleResult(resizes=(Resize(old, new, kind, at=2000.0, **kw),))  # type: ignore[arg-type]


def running(ledger: Ledger, a: Allocation) -> Allocation:
    """`a` reserved and its launch committed, as the ledger holds it."""
    ledger.apply_cycle(CycleResult(admits=(Admit(a),)), pool=POOL)
    ledger.commit(a.id)
    return replace(a, confirmed=True)


def balances(ledger: Ledger, key: str = "acme") -> tuple[int | None, int, int, int]:
    return next(a.as_tuple() for a in ledger.accounts() if str(a.key) == key)


@pytest.fixture
def acme(ledger: Ledger) -> Ledger:
    """Tenant acme with 4 GPUs of quota (cap 4.8 at the default ratio) and project vision."""
    ledger.add_tenant("acme", 4000)
    ledger.add_project("acme", "vision")
    return ledger


@pytest.mark.parametrize(
    ("start", "to", "kind", "want"),
    [
        pytest.param(2, 4, ResizeKind.GROW, (4000, 0, 4000, 0), id="a grow within the cap is reserved in-quota"),
        pytest.param(4, 2, ResizeKind.SHRINK, (4000, 0, 2000, 0), id="a shrink gives back the difference"),
    ],
)
def test_a_resize_replaces_the_allocation_and_records_the_old_and_new_size(
    acme: Ledger, start: int, to: int, kind: ResizeKind, want: tuple[int, int, int, int]
) -> None:
    old = running(acme, elastic("train", start))
    assert balances(acme)[1] == start * 1000  # used, before

    acme.apply_cycle(resized(old, to, kind), pool=POOL)

    [held] = acme.allocations()
    assert held == elastic("train", to)  # the new placement, reserved until the resumption launches
    assert held.request.elastic == RANGE
    assert balances(acme) == want
    assert balances(acme, "acme/vision")[1:] == want[1:]
    entries = acme.entries(kind="resize")
    assert [(e.account, e.bucket, e.amount) for e in entries] == [
        ("acme", "used", -start * 1000),
        ("acme/vision", "used", -start * 1000),
        ("acme", "reserved", to * 1000),
        ("acme/vision", "reserved", to * 1000),
    ]
    assert {(e.details["old_gpus"], e.details["new_gpus"], e.details["resize"]) for e in entries} == {
        (start, to, kind.value)
    }
    assert len({e.op for e in entries}) == 1  # one transaction
    assert acme.rebuild(POOL).ok


def test_a_grow_past_the_cap_is_borrowed_and_a_borrowed_shrink_stays_borrowed(acme: Ledger) -> None:
    old = running(acme, elastic("train", 4))
    acme.apply_cycle(resized(old, 8, ResizeKind.GROW, borrowed=True), pool=POOL)
    assert balances(acme) == (4000, 0, 0, 8000)
    [grown] = acme.allocations()
    assert grown.borrowed

    acme.apply_cycle(resized(grown, 6, ResizeKind.SHRINK, by="p0-run", reason=PreemptReason.RECLAIM), pool=POOL)
    assert balances(acme) == (4000, 0, 0, 6000)
    [shrunk] = acme.allocations()
    assert shrunk.borrowed
    assert shrunk.request.gpus == 6
    shrink = acme.entries(kind="resize")[-1]
    assert (shrink.details["by"], shrink.details["reason"]) == ("p0-run", "reclaim")
    assert acme.rebuild(POOL).ok


def test_the_balances_rebuild_from_a_history_of_resizes(acme: Ledger) -> None:
    a = running(acme, elastic("a", 2))
    for gpus, kind in ((4, ResizeKind.GROW), (2, ResizeKind.SHRINK), (4, ResizeKind.GROW)):
        acme.apply_cycle(resized(a, gpus, kind), pool=POOL)
        acme.commit("a")  # its resumption launched
        [a] = acme.allocations()
    acme.release("a")

    entries = acme.entries()
    assert {str(k): v.as_tuple() for k, v in balances_from_entries(entries).items()} == {
        str(acc.key): acc.as_tuple() for acc in acme.accounts()
    }
    assert balances(acme) == (4000, 0, 0, 0)
    assert cap_violations(entries) == []
    assert acme.rebuild(POOL).ok
    assert len(acme.entries(kind="resize")) == 3 * 4


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        pytest.param(
            lambda old: resized(old, 6, ResizeKind.GROW),
            StaleCycle,
            "past its cap",
            id="an in-quota grow past the cap",
        ),
        pytest.param(
            lambda old: resized(replace(old, request=replace(old.request, gpus=4)), 2, ResizeKind.SHRINK),
            StaleCycle,
            "the ledger holds 2",
            id="a resize from a size the ledger does not hold",
        ),
        pytest.param(
            lambda old: CycleResult(
                resizes=(Resize(old, replace(old, request=replace(old.request, elastic=None)), ResizeKind.GROW, 0.0),)
            ),
            InvalidPlacement,
            "outside its elastic range",
            id="a resize of a request that is not elastic",
        ),
        pytest.param(
            lambda old: CycleResult(
                resizes=(Resize(old, replace(elastic("train", 4), placement=_on_n1(4)), ResizeKind.GROW, 0.0),)
            ),
            StaleCycle,
            "no room for its new placement",
            id="a grow onto GPUs another run holds",
        ),
    ],
)
def test_a_resize_the_ledger_cannot_do_as_made_writes_nothing(
    acme: Ledger, make: object, error: type[Exception], match: str
) -> None:
    acme.add_tenant("other", 8000)
    acme.add_project("other", "ads")
    other = Request("other-run", "other", "ads", Tier.OFFLINE_TRAINING, submit_time=0.0, gpus=2)
    acme.apply_cycle(CycleResult(admits=(Admit(Allocation(other, _on_n1(2), 0.0, confirmed=False)),)), pool=POOL)
    old = running(acme, elastic("train", 2))
    before = dump(acme)
    with pytest.raises(error, match=match):
        acme.apply_cycle(make(old), pool=POOL)  # type: ignore[operator]
    assert dump(acme) == before


def _on_n1(gpus: int) -> Placement:
    """The first `gpus` GPUs of n1 (where `other-run` holds the first two)."""
    return Placement(tuple(GpuSlice("n1", g, 1000) for g in range(gpus)), (NodeShare("n1", 0, 0),))


def test_a_resize_is_a_record_its_resumption_claims_and_takes_the_new_size_over(acme: Ledger) -> None:
    old = running(acme, elastic("train", 4))
    acme.apply_cycle(resized(old, 2, ResizeKind.SHRINK, by="p0-run", reason=PreemptReason.PRIORITY), pool=POOL)

    record = preemption_records(acme.engine, ["train"])["train"]
    assert (record.resized, record.reason, record.by, record.request.gpus) == (
        True,
        PreemptReason.PRIORITY,
        "p0-run",
        4,
    )
    assert record.resumed() == record.request  # a resize keeps the lineage: not one more preemption
    assert claim_resumption(acme.engine, "train", record, "train-2", 3000.0)
    assert not claim_resumption(acme.engine, "train", record, "train-3", 3001.0)  # first come only
    [held] = acme.allocations()
    assert (held.id, held.request.gpus, held.confirmed) == ("train-2", 2, False)
    acme.commit("train-2")  # the resumption launched
    assert balances(acme) == (4000, 2000, 0, 0)
    assert acme.rebuild(POOL).ok
