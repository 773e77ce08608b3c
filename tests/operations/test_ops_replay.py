"""The usage report and the queue view against a replay's event log (issue 25, Tests): a small replay
across midnight whose every cycle is written to a real ledger through the ledger's own `apply_cycle`
(the tick's applier), its finishes released at their instants. `usage` over those entries must equal
the GPU-seconds of the event log's admit-to-finish/preempt intervals, per tenant, project and day; the
queue view on the ledger's state must give each waiting run the place the cycle considered it in."""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from tests.simulate.sim_builders import job, node, pool
from xirang_platform.control.tick_plan import hold_text
from xirang_platform.ledger import Ledger
from xirang_platform.operations.queue_view import queue_rows
from xirang_platform.operations.usage import usage
from xirang_platform.operations.waiting import WaitingRun
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.quota import OvercommitPolicy, QuotaBook
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.simulate.eta import Forecast
from xirang_platform.simulate.events import Event
from xirang_platform.simulate.replay import replay
from xirang_platform.simulate.traces import TraceJob

T0 = datetime(2026, 11, 30, 21, 0, tzinfo=UTC).timestamp()  # three hours before midnight
DAYS = (date(2026, 11, 30), date(2026, 12, 1))
POOL = pool(node("n0", gpus=4), node("n1", gpus=4))
TENANTS = {"acme": 4.0, "beta": 4.0}
PROJECTS = {"acme": "vision", "beta": "ranking"}  # a project lives in one tenant
BOOK = QuotaBook({t: round(g * MILLI_PER_GPU) for t, g in TENANTS.items()}, {(t, p): None for t, p in PROJECTS.items()})
Key = tuple[date, str, str]


class Clock:
    """The ledger's clock, set to each write's simulated instant."""

    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock) -> Iterator[Ledger]:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite'}", policy=OvercommitPolicy(), clock=clock)
    for tenant, gpus in TENANTS.items():
        ledger.add_tenant(tenant, round(gpus * MILLI_PER_GPU))
        ledger.add_project(tenant, PROJECTS[tenant])
    yield ledger
    ledger.close()


def jobs(n: int = 40, seed: int = 7) -> list[TraceJob]:
    """`n` jobs of both tenants over six hours: mostly training that may borrow, some inference
    (P0: it preempts), 1 to 4 GPUs, 20 minutes to 2 hours of work."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        tier = rng.choice(["offline-training"] * 3 + ["online-training"] * 2 + ["inference"])
        tenant = rng.choice(sorted(TENANTS))
        j = job(
            f"j{i:02d}",
            submit=T0 + round(rng.uniform(0, 6 * 3600)),
            duration=float(rng.randrange(1200, 7200, 60)),
            gpus=rng.choice([1, 1, 2, 4]),
            tier=tier,
            tenant=tenant,
        )
        out.append(replace(j, request=replace(j.request, project=PROJECTS[tenant])))
    return out


class LedgerMirror:
    """The replay's observer: writes each cycle to the ledger as the tick would (finishes since the
    last cycle released at their instants, then the cycle through `Ledger.apply_cycle`, its
    admissions committed: the simulator launches at once), and on cycles that admitted nothing notes
    the queue view of the ledger's state next to the order the cycle held the runs in."""

    def __init__(self, ledger: Ledger, clock: Clock, pool: Pool, durations: Mapping[str, float]) -> None:
        self.ledger, self.clock, self.pool, self.durations = ledger, clock, pool, durations
        self.live: dict[str, Allocation] = {}
        self.views: list[tuple[dict[str, list[str]], dict[str, list[str]]]] = []

    def __call__(
        self, now: float, result: CycleResult, pending: Mapping[str, Request], allocations: Mapping[str, Allocation]
    ) -> None:
        victims = {p.victim.id for p in result.preempts}
        self.finish(lambda a: a.id not in allocations and a.id not in victims)
        self.clock.t = now
        held = sum(a.milli for a in self.live.values())
        self.ledger.apply_cycle(result, held / self.pool.gpu_milli, pool=self.pool)
        self.ledger.commit_many([ad.request_id for ad in result.admits])
        self.live = dict(allocations)
        if not result.admits and not result.preempts and len(pending) > 1:
            self.views.append((self.cycle_order(result, pending), self.view_order(result, pending, now)))

    def finish(self, gone: Callable[[Allocation], bool] = lambda a: True) -> None:
        """Release the live allocations `gone` picks (finished: none is preempted), in end order."""
        done = sorted((a for a in self.live.values() if gone(a)), key=lambda a: (self.end(a), a.id))
        for a in done:
            self.clock.t = self.end(a)
            self.ledger.release(a.id, auto_return=False)  # the replay returns only where a cycle decides to
            del self.live[a.id]

    def end(self, a: Allocation) -> float:
        return a.start + self.durations[a.id]  # no checkpoints: a resumed job runs its whole duration again

    @staticmethod
    def cycle_order(result: CycleResult, pending: Mapping[str, Request]) -> dict[str, list[str]]:
        """Per tier, the waiting runs in the order the cycle held them."""
        out: dict[str, list[str]] = defaultdict(list)
        for h in result.holds:
            if h.request_id in pending:
                out[pending[h.request_id].tier.value].append(h.request_id)
        return dict(out)

    def view_order(self, result: CycleResult, pending: Mapping[str, Request], now: float) -> dict[str, list[str]]:
        """Per tier, the waiting runs by their queue-view position, read from the ledger's state."""
        qbook, balances = self.ledger.snapshot()
        allocations = self.ledger.allocations()
        held = sum(a.milli for a in allocations)
        ratio = self.ledger.policy.ratio(held / self.pool.gpu_milli)
        holds = {h.request_id: h for h in result.holds}
        waiting = [
            WaitingRun(
                r.id,
                r.tenant,
                r.project,
                r.tier.value,
                hold_text(holds[r.id], r, qbook, balances, ratio),
                r.submit_time,
                {},
            )
            for r in pending.values()
        ]
        snapshot = replace(Snapshot.build(self.pool, allocations, qbook), balances=balances)
        rows = queue_rows(waiting, dict(pending), snapshot, SchedulerConfig(), Forecast(), now)
        out: dict[str, list[str]] = defaultdict(list)
        for row in sorted(rows, key=lambda row: (row.tier, row.position)):
            out[row.tier].append(row.run_id)
        return dict(out)


def _midnight_splits(t0: float, t1: float) -> Iterator[tuple[date, float]]:
    """(day, seconds) of [t0, t1) split at UTC midnights."""
    while t0 < t1:
        day = datetime.fromtimestamp(t0, UTC).date()
        next_midnight = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() + 86400
        end = min(t1, next_midnight)
        yield day, end - t0
        t0 = end


def log_usage(events: list[Event]) -> dict[Key, dict[str, float]]:
    """Per (day, tenant, project), GPU-seconds in quota and borrowed from the admit-to-finish/preempt
    intervals (a return turns the rest in-quota), and preempted and lost GPU-seconds on the day of
    the preemption (no checkpoints: the whole run is lost)."""
    owner: dict[str, tuple[str, str]] = {}
    open_: dict[str, tuple[float, int, bool]] = {}  # job -> (since, milli, borrowed)
    run_start: dict[str, float] = {}
    out: dict[Key, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def close(job: str, t: float) -> None:
        since, milli, borrowed = open_.pop(job)
        for day, seconds in _midnight_splits(since, t):
            out[(day, *owner[job])]["borrowed" if borrowed else "in_quota"] += seconds * milli / MILLI_PER_GPU

    for e in events:
        job, t = e["job"], e["t"]
        if e["event"] == "submit":
            owner[job] = (e["tenant"], e["project"])
        elif e["event"] == "admit":
            open_[job] = (t, sum(s["milli"] for s in e["alloc"]), e["borrowed"])
            run_start[job] = t
        elif e["event"] == "return":
            milli = open_[job][1]
            close(job, t)
            open_[job] = (t, milli, False)
        elif e["event"] in ("finish", "preempt"):
            milli = open_[job][1]
            close(job, t)
            if e["event"] == "preempt":
                day = datetime.fromtimestamp(t, UTC).date()
                out[(day, *owner[job])]["preempted"] += (t - run_start[job]) * milli / MILLI_PER_GPU
                out[(day, *owner[job])]["lost"] += e["lost_gpu_s"]
    return {k: dict(v) for k, v in out.items()}


def test_usage_and_queue_view_match_a_replay_written_to_the_ledger(ledger: Ledger, clock: Clock) -> None:
    trace = jobs()
    mirror = LedgerMirror(ledger, clock, POOL, {j.request.id: j.duration_s for j in trace})
    result = replay(POOL, BOOK, trace, observe=mirror)
    mirror.finish()  # the finishes after the last cycle
    events = result.events
    kinds = {e["event"] for e in events}
    # The scenario exercises every kind of holding the report splits, across midnight.
    assert {"preempt", "return"} <= kinds
    assert any(e["event"] == "admit" and e["borrowed"] for e in events)
    until = max(e["t"] for e in events)
    assert until > datetime(2026, 12, 1, tzinfo=UTC).timestamp()

    rows = usage(ledger.entries(), DAYS[0], DAYS[1], until)

    got = {
        (r.day, r.tenant, r.project): {
            "in_quota": r.in_quota_s,
            "borrowed": r.borrowed_s,
            "preempted": r.preempted_s,
            "lost": r.lost_s,
        }
        for r in rows
        if r.project
    }
    want = log_usage(events)
    assert sorted(got) == sorted(want)
    for key, figures in want.items():
        for name in ("in_quota", "borrowed", "preempted", "lost"):
            assert got[key][name] == pytest.approx(figures.get(name, 0.0), abs=1e-6), (key, name)
    # Borrowed GPU-seconds are lent by someone: the lenders' credits (or the pool's) add up to them.
    for r in rows:
        if r.project:
            assert sum(r.borrowed_from_s.values()) == pytest.approx(r.borrowed_s, abs=1e-6)

    # The queue view on the ledger's state places the runs as the cycle considered them.
    assert mirror.views
    for cycle_order, view_order in mirror.views:
        assert view_order == cycle_order
