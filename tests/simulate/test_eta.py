"""The queue estimate by forward simulation (`simulate/eta.py`): its rules case by case, its
invariants as properties, and its bound in cycles and planner steps on a worst case."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.scheduling.cycle_builders import job, node, quotas, running
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.quota import OvercommitPolicy, QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.simulate.eta import EtaResult, Forecast, estimate_starts

NOW = 1_000.0
FIXED_CAP = SchedulerConfig(min_runtime_s=600, overcommit=OvercommitPolicy(max_ratio=1.0))


@dataclass
class Queue:
    """One table row: nodes of 8 H100s, what runs (with its expected end), what waits (with its
    expected duration), and the estimate wanted per waiting request (seconds after NOW; None: unknown)."""

    nodes: int
    running: list[tuple[Allocation, float | None]]
    waiting: list[tuple[object, float | None]]
    want: dict[str, float | None]
    book: QuotaBook | None = None
    config: SchedulerConfig = field(default_factory=lambda: FIXED_CAP)


def estimate(q: Queue) -> EtaResult:
    pool = Pool(tuple(node(f"n{i}").build() for i in range(q.nodes)))
    book = q.book or QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    snapshot = Snapshot.build(pool, [a for a, _ in q.running], book)
    pending = [b.build() for b, _ in q.waiting]  # type: ignore[attr-defined]
    forecast = Forecast(
        {a.id: None if end is None else NOW + end for a, end in q.running},
        {r.id: took for r, (_, took) in zip(pending, q.waiting, strict=True)},
    )
    return estimate_starts(snapshot, pending, NOW, q.config, forecast, resolution_s=0, precision=0)


def after_now(result: EtaResult) -> dict[str, float | None]:
    return {rid: None if t is None else t - NOW for rid, t in result.starts.items()}


EIGHT = {"n0": list(range(8))}
LOW, HIGH = {"n0": [0, 1, 2, 3]}, {"n0": [4, 5, 6, 7]}


@pytest.mark.parametrize(
    "q",
    [
        pytest.param(
            Queue(
                1,
                [(running(job("k").gpus(8), EIGHT, start=0), 300)],
                [(job("a").gpus(4).at(1), 100), (job("b").gpus(4).at(2), 50), (job("c").gpus(8).at(3), None)],
                {"a": 300, "b": 300, "c": 400},
            ),
            id="a queue behind a running job with a known end starts at that end, then at the ends it leads to",
        ),
        pytest.param(
            Queue(
                1,
                [(running(job("k").gpus(4), LOW, start=0), 300), (running(job("u").gpus(4), HIGH, start=0), None)],
                [(job("a").gpus(4).at(1), 200), (job("b").gpus(4).at(2), 100), (job("c").gpus(8).at(3), 100)],
                {"a": 300, "b": 500, "c": None},
            ),
            id="an unknown end makes the request that needs its units unknown, not the ones the known ends start",
        ),
        pytest.param(
            Queue(
                1,
                [(running(job("k").gpus(4), LOW, start=0), 300), (running(job("u").gpus(4), HIGH, start=0), None)],
                [(job("a").gpus(4).at(1), None), (job("b").gpus(4).at(2), 100)],
                {"a": 300, "b": None},
            ),
            id="a request admitted for an unknown time makes the one that waits for its units unknown",
        ),
        pytest.param(
            Queue(
                2,
                [(running(job("r1").gpus(4).tier("inference"), LOW, start=0), 500)],
                [(job("r2").gpus(4).tier("inference").at(1), 100)],
                {"r2": 500},
                book=quotas({"acme": 4, "beta": 12}),
            ),
            id="a quota cap delays a start: a replica over its tenant's cap waits for its own tenant's end",
        ),
        pytest.param(
            Queue(
                1,
                [(running(job("p2").gpus(8).tenant("beta"), EIGHT, start=0), 5_000)],
                [(job("replica").gpus(2).tier("inference").at(1), 100), (job("batch").gpus(8).at(2), 100)],
                {"replica": 0, "batch": 6_100},
                book=quotas({"acme": 8, "beta": 8}),
            ),
            id="preemption makes a P0 start now; its victim resumes first, for its whole run again, then the P2",
        ),
        pytest.param(
            Queue(
                1,
                [(running(job("k").gpus(8), EIGHT, start=0), 300)],
                [(job("huge").gpus(16).at(1), 100), (job("a").gpus(8).at(2), 100)],
                {"huge": None, "a": 300},
            ),
            id="a request the pool can never hold is unknown and does not block the rest",
        ),
    ],
)
def test_the_estimate_is_the_simulated_admission(q: Queue) -> None:
    assert after_now(estimate(q)) == q.want


def test_a_preempted_victim_that_checkpointed_resumes_with_only_its_unsaved_work_left() -> None:
    # The replica preempts p2 at NOW; p2 (ran 1,000 s of 3,000, checkpointing every 300 s) saved 900
    # s and has 2,100 s left. It resumes when the replica ends (NOW + 100), so the batch job behind it,
    # which needs the whole node, starts when p2 has run them: NOW + 100 + 2,100.
    config = SchedulerConfig(min_runtime_s=600, checkpoint_interval_s=300)
    q = Queue(
        1,
        [(running(job("p2").gpus(6).tenant("beta"), {"n0": list(range(6))}, start=0), 2_000)],
        [(job("replica").gpus(4).tier("inference").at(1), 100), (job("all").gpus(8).tenant("beta").at(2), 10)],
        {"replica": 0, "all": 2_200},
        book=quotas({"acme": 8, "beta": 8}),
        config=config,
    )
    assert after_now(estimate(q)) == q.want


def test_time_moves_to_the_next_tick_when_the_live_tick_has_an_interval() -> None:
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    snapshot = Snapshot.build(pool, [running(job("k").gpus(8), EIGHT, start=0)], book)
    forecast = Forecast({"k": NOW + 7}, {"a": 3.0})
    got = estimate_starts(snapshot, [job("a").gpus(8).build()], NOW, FIXED_CAP, forecast, tick_s=5, resolution_s=0)
    assert got.starts == {"a": NOW + 10}


@pytest.mark.parametrize(
    ("resolution_s", "precision", "want"),
    [
        pytest.param(0, 0, 300, id="exact: every end is an instant of its own"),
        pytest.param(60, 0, 300, id="an end alone within the resolution is simulated at its own instant"),
        pytest.param(200, 0, 420, id="ends within the resolution are taken together, at the last of them"),
        pytest.param(0, 0.5, 420, id="ends within a share of the time to the first are taken together"),
    ],
)
def test_ends_close_together_are_taken_together_when_cycles_run_short(
    resolution_s: float, precision: float, want: float
) -> None:
    # k1 and k2 hold four GPUs each and end 120 s apart; `a` needs four. Two cycles: after the first,
    # two ends are pending and one cycle is left.
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    runs = [running(job("k1").gpus(4), LOW, start=0), running(job("k2").gpus(4), HIGH, start=0)]
    forecast = Forecast({"k1": NOW + 300, "k2": NOW + 420}, {"a": 10.0})
    got = estimate_starts(
        Snapshot.build(pool, runs, book),
        [job("a").gpus(4).build()],
        NOW,
        FIXED_CAP,
        forecast,
        max_cycles=2,
        resolution_s=resolution_s,
        precision=precision,
    )
    assert got.starts == {"a": NOW + want}


def test_ends_are_simulated_one_by_one_while_the_cycles_left_cover_them() -> None:
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    runs = [running(job("k1").gpus(4), LOW, start=0), running(job("k2").gpus(4), HIGH, start=0)]
    forecast = Forecast({"k1": NOW + 300, "k2": NOW + 320}, {"a": 10.0})
    snapshot = Snapshot.build(pool, runs, book)
    got = estimate_starts(snapshot, [job("a").gpus(4).build()], NOW, FIXED_CAP, forecast, resolution_s=600)
    assert got.starts == {"a": NOW + 300}


def test_the_snapshot_is_left_as_it_was() -> None:
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    snapshot = Snapshot.build(pool, [running(job("k").gpus(8), EIGHT, start=0)], book)
    free = snapshot.state.allocated_milli
    estimate_starts(snapshot, [job("a").gpus(8).build()], NOW, FIXED_CAP, Forecast({"k": NOW + 5}, {"a": 1.0}))
    assert (snapshot.state.allocated_milli, list(snapshot.allocations)) == (free, ["k"])


def test_a_bad_bound_is_refused_with_the_fix() -> None:
    pool = Pool((node("n0").build(),))
    snapshot = Snapshot.build(pool, [], quotas({"acme": 8}))
    with pytest.raises(ValueError, match="max_cycles must be >= 1 cycle, got 0"):
        estimate_starts(snapshot, [], NOW, FIXED_CAP, Forecast(), max_cycles=0)
    with pytest.raises(ValueError, match="tick_s must be >= 0 seconds, got -1"):
        estimate_starts(snapshot, [], NOW, FIXED_CAP, Forecast(), tick_s=-1)
    with pytest.raises(ValueError, match=r"precision must be in \[0, 1\)"):
        estimate_starts(snapshot, [], NOW, FIXED_CAP, Forecast(), precision=1.0)


# -- properties ----------------------------------------------------------------------------------------

TIERS = ("inference", "online-training", "offline-training", "batch-inference")
asks = st.lists(st.tuples(st.integers(1, 8), st.sampled_from(TIERS), st.one_of(st.none(), st.integers(0, 900))))


@settings(max_examples=60, deadline=None)
@given(queue=asks.filter(bool), nodes=st.integers(1, 3))
def test_the_head_of_an_idle_pool_starts_now(queue: list[tuple[int, str, int | None]], nodes: int) -> None:
    pool = Pool(tuple(node(f"n{i}").domain(f"d{i}").build() for i in range(nodes)))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    pending = [job(f"w{i}").gpus(g).tier(t).at(float(i)).build() for i, (g, t, _) in enumerate(queue)]
    snapshot = Snapshot.build(pool, [], book)
    got = estimate_starts(snapshot, pending, NOW, SchedulerConfig(), Forecast({}, {}))
    head = next(iter(queue_order(pending, book, snapshot.balances or {})))
    assert got.starts[head.id] == NOW


@settings(max_examples=60, deadline=None)
@given(
    queue=asks,
    ends=st.lists(st.one_of(st.none(), st.integers(-100, 3_000)), min_size=8, max_size=8),
)
def test_an_estimate_never_precedes_now_and_is_unknown_only_with_a_reason(
    queue: list[tuple[int, str, int | None]], ends: list[int | None]
) -> None:
    # One node full of eight 1-GPU runs, each with its expected end (some past, some unknown).
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    runs = [running(job(f"k{g}"), {"n0": [g]}, start=0) for g in range(8)]
    pending = [job(f"w{i}").gpus(g).tier(t).at(float(i)).build() for i, (g, t, _) in enumerate(queue)]
    forecast = Forecast(
        {a.id: None if e is None else NOW + e for a, e in zip(runs, ends, strict=True)},
        {r.id: took for r, (_, _, took) in zip(pending, queue, strict=True)},
    )
    got = estimate_starts(Snapshot.build(pool, runs, book), pending, NOW, SchedulerConfig(), forecast)
    assert set(got.starts) == {r.id for r in pending}
    assert all(t is None or t >= NOW for t in got.starts.values())
    if all(e is not None for e in ends) and all(took is not None for _, _, took in queue):
        assert all(t is not None for t in got.starts.values())  # every duration known: every start is


# -- the bound ------------------------------------------------------------------------------------------


def test_the_estimate_stops_at_its_cycle_bound_and_each_cycle_within_the_planners_budget() -> None:
    # Worst case for the number of cycles: a full pool of 32 one-GPU runs, each ending at its own
    # instant and each turning preemptible at its own instant, and 60 requests of 1 to 4 GPUs: every
    # end and every age is an event. Worst case for the planner: each request is a P1 that may
    # reclaim the borrowed P2 work. The estimate runs at most `max_cycles` cycles, and its planner
    # steps stay within that many cycles' budgets.
    pool = Pool(tuple(node(f"n{i}").domain(f"d{i // 2}").build() for i in range(4)))
    book = quotas({"acme": 16, "beta": 16})
    runs = [
        running(job(f"k{i}").tenant("beta"), {f"n{i // 8}": [i % 8]}, start=NOW - 600 + i, borrowed=True)
        for i in range(32)
    ]
    pending = [job(f"w{i}").gpus(1 + i % 4).tier("online-training").at(float(i)).build() for i in range(60)]
    ends = {a.id: NOW + 10.0 * (i + 1) for i, a in enumerate(runs)}
    forecast = Forecast(ends, dict.fromkeys((r.id for r in pending), 5.0))
    config = SchedulerConfig(min_runtime_s=600, plan_steps_per_request=8, plan_steps_per_cycle=40)
    snapshot = Snapshot.build(pool, runs, book)

    cut = estimate_starts(snapshot, pending, NOW, config, forecast, max_cycles=6)
    whole = estimate_starts(snapshot, pending, NOW, config, forecast, max_cycles=10_000)

    assert (cut.cycles, cut.horizon) == (6, True)
    assert 0 < cut.plan_steps <= cut.cycles * (config.plan_steps_per_cycle + config.plan_steps_per_request)
    assert any(t is None for t in cut.starts.values())  # past the horizon: unknown, not guessed
    assert sum(t is not None for t in cut.starts.values()) < len(pending)
    assert not whole.horizon
    assert all(t is not None for t in whole.starts.values())
    # Each cycle follows an event: an end, an age, an admission's end; or it follows progress at once.
    assert whole.cycles <= 2 * (len(runs) * 2 + len(pending) * 2)
    assert whole.plan_steps <= whole.cycles * (config.plan_steps_per_cycle + config.plan_steps_per_request)


def test_a_wall_clock_guard_stops_the_estimate_after_its_first_cycle() -> None:
    # The live tick's guard: once it says so no further cycle runs; what is not admitted is unknown.
    pool = Pool((node("n0").build(),))
    book = QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    snapshot = Snapshot.build(pool, [running(job("k").gpus(4), LOW, start=0)], book)
    pending = [job("now").gpus(4).at(1).build(), job("later").gpus(8).at(2).build()]
    forecast = Forecast({"k": NOW + 300}, {"now": 100.0, "later": 100.0})
    got = estimate_starts(snapshot, pending, NOW, FIXED_CAP, forecast, out_of_time=lambda: True)
    assert (got.starts, got.cycles, got.horizon) == ({"now": NOW, "later": None}, 1, True)
