"""Fill mode (`xirang simulate --mode fill`): FGD's method of measuring a placement policy.

Pods arrive one at a time and never leave; each is placed by the real scheduler `cycle` (preemption
off) or dropped if it fits nowhere. The figure of merit is the share of GPU capacity allocated when
the GPU demand that has arrived equals the capacity (`alloc_ratio_at_100`), as in Weng et al.,
USENIX ATC '23, and their simulator (github.com/hkust-adsl/kubernetes-scheduler-simulator, commit
8f3d641), whose workload inflation and allocation curve are reproduced here (`fill_workload`,
`alloc_curve`). The pool and pods come from `simulate/inputs.load_openb`.

Per seed: the pods sorted by name, a seeded shuffle, then uniform draws with replacement appended
until the next draw would push the demand past `ratio` (130%) of capacity; node ties go to a seeded
node order (`SchedulerConfig.node_priority`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.apply import apply_cycle
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.quota import QuotaBook, balances_from
from xirang_platform.scheduling.scorers import SCORERS, NodeScorer, make_scorer
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot
from xirang_platform.scheduling.state import ClusterState

FILL_RATIO = 1.3
CURVE_COLUMNS = range(0, 131)
FILL_POLICIES = tuple(SCORERS)


@dataclass(frozen=True)
class FillResult:
    """The outcome of one fill run.

    `curve[k]` is the mean allocated share of GPU capacity (percent) over the pod events whose arrived
    demand rounds to k percent of capacity (NaN where no event is near k).
    """

    policy: str
    seed: int
    alloc_ratio_at_100: float
    alloc_ratio_at_130: float
    curve: dict[int, float]
    pods: int
    placed: int
    dropped: int
    arrived_milli: int
    allocated_milli: int
    seconds: float
    events: tuple[tuple[int, int], ...] = field(default=(), repr=False)  # (arrived, allocated) per pod
    state: ClusterState | None = field(default=None, repr=False, compare=False)  # the filled pool


def gpu_demand(request: Request) -> int:
    """GPU milli a pod asks in total (0 for CPU-only)."""
    return request.gpus * request.milli_per_gpu if request.gpus else 0


def fill_workload(pods: Sequence[Request], capacity_milli: int, seed: int, ratio: float = FILL_RATIO) -> list[Request]:
    """The pods in arrival order for one seed: all of `pods` (sorted by id) in a seeded random order,
    then uniform draws with replacement (renamed `<id>-tuned-<i>`) appended while the demand stays
    within `ratio` of `capacity_milli`.

    As FGD's simulator does, the stop test adds the draw's milli *per GPU* while the running total
    adds its total milli; the first draw that fails the test ends the list.
    """
    if not pods:
        raise ValueError("fill mode needs at least one pod; give a pod list with rows")
    originals = sorted(pods, key=lambda r: r.id)
    rng = np.random.default_rng(seed)
    order = [originals[i] for i in rng.permutation(len(originals))]
    total = sum(gpu_demand(r) for r in originals)
    target = ratio * capacity_milli
    if not any(r.gpus for r in originals):
        return order  # nothing would ever push the demand up: no tuning
    i = 0
    while True:
        pick = originals[int(rng.integers(len(originals)))]
        per_gpu = pick.milli_per_gpu if pick.gpus else 0
        if total + per_gpu > target:
            break
        total += gpu_demand(pick)
        order.append(replace(pick, id=f"{pick.id}-tuned-{i}"))
        i += 1
    return order


def alloc_curve(events: Sequence[tuple[int, int]], capacity_milli: int) -> dict[int, float]:
    """FGD's discrete allocation curve from (arrived, allocated) milli after each pod.

    Column k is the mean of the allocated percentages (each rounded to 2 decimals) over the events
    whose arrived percentage rounds half-to-even to k; where none does, over those rounding to k-1..k+1.
    """
    gpus = capacity_milli / MILLI_PER_GPU
    arrive = np.array([round(a / gpus / 10, 0) for a, _ in events])
    alloc = np.array([round(u / gpus / 10, 2) for _, u in events])
    curve: dict[int, float] = {}
    for k in CURVE_COLUMNS:
        sel = arrive == k
        if not sel.any():
            sel = (arrive >= k - 1) & (arrive <= k + 1)
        curve[k] = round(float(alloc[sel].mean()), 2) if sel.any() else math.nan
    return curve


def fill_scorer(policy: str, pods: Sequence[Request], seed: int = 0) -> NodeScorer:
    """The scorer fill mode uses for `policy`, as FGD's experiments configure it (`bestfit` with the
    repository's integer score)."""
    if policy not in FILL_POLICIES:
        raise ValueError(f"unknown fill policy {policy!r}; choose one of {', '.join(FILL_POLICIES)}")
    return make_scorer(policy, pods, seed, fill=True)


def run_fill(
    pool: Pool,
    pods: Sequence[Request],
    policy: str | NodeScorer,
    seed: int,
    *,
    ratio: float = FILL_RATIO,
    keep_events: bool = False,
) -> FillResult:
    """Fill `pool` with `pods` (the original trace; the seed builds the arrival order) under `policy`
    (a fill policy name or a scorer) and measure the allocation curve.

    Every pod goes through `cycle` with preemption off and node ties in the seed's order; a pod that
    fits nowhere is dropped. The pods' tenants/projects are charged to one tenant owning the pool.
    """
    scorer = fill_scorer(policy, pods, seed) if isinstance(policy, str) else policy
    started = time.perf_counter()
    arrivals = fill_workload(pods, pool.gpu_milli, seed, ratio)
    state = ClusterState(pool)
    book = _one_tenant_book(pool, arrivals)
    # No pod waits in fill mode (each is decided once, on arrival): no gang reservation to look for.
    config = SchedulerConfig(preemption=False, starvation_wait_s=math.inf, scorer=scorer, node_priority_seed=seed)
    # State, allocations and balances are kept here incrementally and handed to every cycle, so a
    # cycle costs the same with 10 pods placed as with 10,000.
    allocations: dict[str, Allocation] = {}
    balances = balances_from(book, ())
    snapshot = Snapshot(pool, state, MappingProxyType(allocations), book, MappingProxyType(balances))
    events: list[tuple[int, int]] = []
    arrived = placed = 0
    memo = None  # each cycle starts from the last one's end (`cycle_memo.CycleMemo`), as the replay's do
    for request in arrivals:
        arrived += gpu_demand(request)
        result = cycle(snapshot, [request], float(len(events)), config, memo)
        memo = result.memo
        placed += len(apply_cycle(result, state, allocations, balances=balances, book=book).admitted)
        events.append((arrived, state.allocated_milli))
    seconds = time.perf_counter() - started
    curve = alloc_curve(events, pool.gpu_milli)
    return FillResult(
        policy=policy if isinstance(policy, str) else scorer.name,
        seed=seed,
        alloc_ratio_at_100=curve[100],
        alloc_ratio_at_130=curve[130],
        curve=curve,
        pods=len(arrivals),
        placed=placed,
        dropped=len(arrivals) - placed,
        arrived_milli=arrived,
        allocated_milli=state.allocated_milli,
        seconds=seconds,
        events=tuple(events) if keep_events else (),
        state=state,
    )


def _one_tenant_book(pool: Pool, pods: Sequence[Request]) -> QuotaBook:
    """One quota account per tenant/project seen, each owning the whole pool (fill mode has no quota)."""
    capacity = pool.gpu_milli
    tenants = {r.tenant: capacity for r in pods}
    projects = {(r.tenant, r.project): None for r in pods}
    return QuotaBook(tenants, projects)
