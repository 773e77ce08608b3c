"""Elastic training in the cycle (DESIGN.md section 11, `scheduling/elastic.py`): admission at the
largest size that fits without taking units a waiting request could use, growth only into lasting
idle units nobody waiting wants, shrinks instead of stops, and the applier."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.scheduling.cycle_builders import job, node, quotas, running
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.apply import apply_cycle
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.elastic import LastingFree, at_size, shrunk_placement, size_tries
from xirang_platform.scheduling.model import HoldReason, PreemptReason, ResizeKind
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot

CONFIG = SchedulerConfig(min_runtime_s=600)


def pool_of(*nodes):
    return Pool(tuple(n.build() for n in nodes))


def snap(pool, running_=(), book=None, lasting_free=None):
    book = book or QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    return replace(Snapshot.build(pool, running_, book), lasting_free=lasting_free)


def sizes_of(result):
    return {a.request_id: a.allocation.request.gpus for a in result.admits}


@pytest.mark.parametrize(
    ("free_nodes", "pending", "want"),
    [
        pytest.param(2, [job("e").elastic(2, 16)], {"e": 16}, id="alone on an idle pool it takes its largest size"),
        pytest.param(1, [job("e").elastic(2, 16)], {"e": 8}, id="it takes the largest size that fits now"),
        pytest.param(
            2,
            [job("e").elastic(2, 16).at(0), job("f").gpus(8).at(5)],
            {"e": 8, "f": 8},
            id="a later request of the queue keeps the units it can use: e grows only into what is left",
        ),
        pytest.param(
            1,
            [job("e").elastic(4, 8).at(0), job("f").gpus(6).at(5)],
            {"e": 8},
            id="a request that cannot fit beside its minimum could not use the units this cycle: e takes them",
        ),
        pytest.param(
            2,
            [job("e").elastic(2, 16, 2).at(0), job("d").elastic(2, 16, 2).at(1)],
            {"e": 14, "d": 2},
            id="two elastic requests: both admitted at their minimum, then enlarged in queue order",
        ),
    ],
)
def test_admission_takes_the_largest_size_the_queue_leaves(free_nodes, pending, want) -> None:
    pool = pool_of(*(node(f"n{i}") for i in range(free_nodes)))
    result = cycle(snap(pool), [b.build() for b in pending], 1_000.0, CONFIG)
    assert sizes_of(result) == want
    assert result.resizes == ()


def test_admission_in_quota_stays_within_the_cap() -> None:
    pool = pool_of(node("n0"), node("n1"))
    book = quotas({"acme": 6, "other": 10})
    result = cycle(snap(pool, book=book), [job("e").elastic(2, 16).build()], 1_000.0, CONFIG)
    (admit,) = result.admits
    assert not admit.allocation.borrowed
    assert admit.allocation.milli <= 6_000 * CONFIG.overcommit.max_ratio


def grown(pool, runs, lasting_free, pending=(), config=CONFIG):
    return cycle(snap(pool, runs, lasting_free=lasting_free), list(pending), 5_000.0, config)


ELASTIC_RUN = running(job("e").elastic(2, 16, now=4), on={"n0": [0, 1, 2, 3]}, start=0)


@pytest.mark.parametrize(
    ("lasting_free", "pending", "want"),
    [
        pytest.param(None, [], None, id="no idle history: no growth"),
        pytest.param(0, [], None, id="units freed just now: no growth"),
        pytest.param(12_000, [], 16, id="units idle for the span: it grows to its largest size"),
        pytest.param(4_000, [], 8, id="it grows only by the milli that stayed idle"),
        pytest.param(12_000, [job("w").gpus(15)], None, id="a request waiting for room wants the units: no growth"),
        pytest.param(12_000, [job("w").gpus(14)], 2, id="a waiting request shrinks it back to its minimum instead"),
        pytest.param(12_000, [job("w").gpus(8)], 8, id="what a request admitted this cycle took is not grown into"),
    ],
)
def test_growth_only_into_lasting_idle_units_nobody_waiting_wants(lasting_free, pending, want) -> None:
    pool = pool_of(node("n0"), node("n1"))
    result = grown(pool, [ELASTIC_RUN], lasting_free, [b.build() for b in pending])
    if want is None:
        assert result.resizes == ()
        return
    (r,) = result.resizes
    kind = ResizeKind.GROW if want > 4 else ResizeKind.SHRINK
    assert (r.kind, r.old.request.gpus, r.new.request.gpus, r.new.id) == (kind, 4, want, "e")
    assert r.new.start == 5_000.0


def test_growth_is_off_without_a_span() -> None:
    pool = pool_of(node("n0"), node("n1"))
    result = grown(pool, [ELASTIC_RUN], 12_000, config=replace(CONFIG, elastic_grow_idle_s=None))
    assert result.resizes == ()


@pytest.mark.parametrize(
    ("tier", "borrowed", "quota", "want"),
    [
        pytest.param("online-training", False, 6, (7, False), id="an in-quota P1 run grows to its cap"),
        pytest.param("offline-training", False, 6, (7, False), id="an in-quota P2 run grows to its cap, not past"),
        pytest.param("offline-training", True, 2, (16, True), id="a borrowed P2 run grows borrowed"),
    ],
)
def test_a_run_grows_within_the_cap_it_runs_under(tier, borrowed, quota, want) -> None:
    pool = pool_of(node("n0"), node("n1"))
    book = quotas({"acme": quota, "other": 10})
    run = running(job("e").tier(tier).elastic(2, 16, now=4), on={"n0": [0, 1, 2, 3]}, start=0, borrowed=borrowed)
    result = cycle(snap(pool, [run], book=book, lasting_free=12_000), [], 5_000.0, CONFIG)
    (r,) = result.resizes
    assert (r.new.request.gpus, r.new.borrowed) == want


def full_pool_with_elastic(tier="offline-training"):
    pool = pool_of(node("n0"), node("n1"))
    e = running(job("e").tier(tier).elastic(2, 16, now=16), on={"n0": list(range(8)), "n1": list(range(8))}, start=0)
    return pool, e


@pytest.mark.parametrize(
    ("request_", "want_size", "want_reason"),
    [
        pytest.param(
            job("inf").tier("inference").milli(500), 15, PreemptReason.PRIORITY, id="a replica: one GPU given back"
        ),
        pytest.param(job("p1").tier("online-training").gpus(8), 8, PreemptReason.PRIORITY, id="a P1 gang: one node"),
        pytest.param(job("p2").gpus(4), 12, PreemptReason.RECLAIM, id="a P2 request takes back what enlarged its peer"),
        pytest.param(
            job("p2").gpus(15), None, None, id="never below its minimum: 15 GPUs do not fit beside 2, nothing moves"
        ),
    ],
)
def test_a_request_that_does_not_fit_shrinks_an_elastic_run_instead_of_stopping_it(
    request_, want_size, want_reason
) -> None:
    pool, e = full_pool_with_elastic()
    result = cycle(snap(pool, [e]), [request_.build()], 5_000.0, CONFIG)
    if want_size is None:
        assert (result.resizes, result.preempts) == ((), ())
        assert [h.reason for h in result.holds] == [HoldReason.NO_FIT]
        return
    (r,) = result.resizes
    assert (r.kind, r.new.request.gpus, r.by, r.reason) == (
        ResizeKind.SHRINK,
        want_size,
        request_.build().id,
        want_reason,
    )
    assert result.preempts == ()
    assert [a.request_id for a in result.admits] == [request_.build().id]


def test_a_shrink_plan_keeps_only_the_shrinks_it_needs() -> None:
    # a (most surplus) is shrunk first, but 7 GPUs of d0 do not hold the 8-GPU gang; b's do, alone.
    pool = pool_of(node("n0"), node("n1").gpus(10).domain("d1"))
    a = running(job("a").elastic(1, 8, now=8), on={"n0": list(range(8))}, start=0)
    b = running(job("b").elastic(2, 8, now=8), on={"n1": list(range(8))}, start=0)
    gang = job("g").tier("online-training").gpus(8).build()
    result = cycle(snap(pool, [a, b]), [gang], 5_000.0, CONFIG)
    assert [(r.old.id, r.new.request.gpus) for r in result.resizes] == [("b", 2)]


def test_p1_in_quota_elastic_run_is_shrunk_only_to_its_minimum_never_stopped() -> None:
    pool, e = full_pool_with_elastic("online-training")
    result = cycle(snap(pool, [e]), [job("p0").tier("inference").gpus(1).build()], 5_000.0, CONFIG)
    assert result.preempts == ()
    (r,) = result.resizes
    assert r.new.request.gpus == 15
    result = cycle(snap(pool, [e]), [job("big").tier("online-training").gpus(16).build()], 5_000.0, CONFIG)
    assert (result.preempts, result.resizes) == ((), ())
    assert [h.reason for h in result.holds] == [HoldReason.NO_FIT]


def test_the_applier_replaces_the_allocation_and_keeps_the_id() -> None:
    pool, e = full_pool_with_elastic()
    snapshot = snap(pool, [e])
    result = cycle(snapshot, [job("inf").tier("inference").gpus(2).build()], 5_000.0, CONFIG)
    state, allocations = snapshot.state.copy(), dict(snapshot.allocations)
    applied = apply_cycle(result, state, allocations, confirm=True)
    assert (allocations["e"].request.gpus, allocations["e"].confirmed) == (14, True)
    assert [r.kind for r, _ in applied.resized] == [ResizeKind.SHRINK]
    assert (state.allocated_milli, state.check()) == (16_000, [])
    with pytest.raises(ValueError, match="resizes e"):
        apply_cycle(result, snapshot.state.copy(), {})


def test_shrunk_placement_empties_the_node_it_holds_fewest_gpus_on() -> None:
    r = job("e").elastic(2, 12, now=12).cpu(12_000).build()
    a = running(job("e").elastic(2, 12, now=12).cpu(12_000), on={"n0": list(range(8)), "n1": [0, 1, 2, 3]})
    small = shrunk_placement(a.placement, at_size(r, 8))
    assert [s.node for s in small.slices] == ["n0"] * 8
    assert [(s.node, s.cpu_milli) for s in small.shares] == [("n0", 8_000)]


@pytest.mark.parametrize(("sizes", "want"), [(0, 0), (1, 1), (2, 2), (15, 5), (100_000, 18)])
def test_size_search_bound(sizes, want) -> None:
    assert size_tries(sizes) == want


@pytest.mark.parametrize(
    ("records", "now", "want"),
    [
        pytest.param([], 1_000, 0, id="no history: nothing has lasted"),
        pytest.param([(0, 4_000)], 500, 0, id="the history does not cover the span yet"),
        pytest.param([(0, 4_000)], 700, 4_000, id="free since before the span"),
        pytest.param([(0, 4_000), (500, 1_000), (900, 8_000)], 1_000, 1_000, id="a dip inside the span counts"),
        pytest.param([(0, 4_000), (500, 1_000), (900, 8_000)], 1_600, 8_000, id="the dip left the span"),
    ],
)
def test_lasting_free_is_the_least_free_milli_over_the_span(records, now, want) -> None:
    history = LastingFree(600)
    for t, free in records:
        history.record(t, free)
    assert history.lasting(now) == want
