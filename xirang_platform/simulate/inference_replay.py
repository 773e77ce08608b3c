"""Autoscaled inference in the replay, and the two ways to run a pool: unified and siloed.

`AutoscaledService` is a replay load source: every `tick_s` of simulated time it reads the load
series, runs the core policy (`scheduling/replica_scaling.py`) and submits P0 replica requests (scale-up) or
stops replicas (scale-down: waiting ones leave the queue, running ones release their units, which go
to training in the same cycle). When the load ends, every replica stops.

Policies (DESIGN.md section 8, `--policy`):
- unified: one pool, one replay. The inference tenant's quota is the partition siloed would give it
  (so both policies guarantee inference the same GPUs); what it does not use now is lent to training
  as borrowed units, and a scale-up takes them back (the cycle reclaims borrowed work and preempts P2).
- siloed: the honest baseline of separately run clusters. Inference gets a fixed partition of whole
  nodes sized to its own peak (the replicas the policy asks for at the load's highest point), training
  the rest; two replays, no lending either way. Their event logs are merged in time order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from xirang_platform.load.traces import LoadSeries
from xirang_platform.pool.model import MILLI_PER_GPU, Node, Pool
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.scheduling.replica_scaling import (
    ScaleDecision,
    ScalerMemory,
    ServiceSpec,
    cap_replicas,
    decide,
    replica_requests,
    replicas_to_release,
)
from xirang_platform.scheduling.snapshot import SchedulerConfig
from xirang_platform.simulate.events import Event
from xirang_platform.simulate.replay import LoadSource, ReplayOptions, ReplayResult, TraceSource, replay
from xirang_platform.simulate.traces import TraceJob

POLICIES = ("unified", "siloed")


class AutoscaledService:
    """A replay load source that runs the autoscaling policy for one service on a load series."""

    def __init__(self, spec: ServiceSpec, load: LoadSeries, cap: int | None, tick_s: float = 60.0) -> None:
        if tick_s <= 0:
            raise ValueError(f"autoscaler tick must be > 0 seconds, got {tick_s}")
        self.spec, self.load, self.cap, self.tick_s = spec, load, cap, tick_s
        self.memory = ScalerMemory()
        self.live: list[str] = []  # replica ids asked for and not stopped, oldest first
        self.next_index = 0
        self.tick: float | None = load.start
        self.decisions: list[ScaleDecision] = []
        self._submit: list[TraceJob] = []

    def next_time(self) -> float | None:
        """The next tick (None after the load ended and every replica stopped)."""
        return self.tick

    def stop(self, now: float, waiting: Collection[str]) -> list[str]:
        """The replicas to stop at `now`: those a scale-down releases (waiting first), or all at the end."""
        if self.tick is None or now < self.tick:
            return []
        if now >= self.load.end:
            everything, self.live, self.tick = list(reversed(self.live)), [], None
            return everything
        d = decide(self.spec, self.memory, len(self.live), self.load.at(now), now, self.cap)
        self.memory = d.memory
        self.decisions.append(d)
        self.tick = min(now + self.tick_s, self.load.end)
        stopped: list[str] = []
        if d.delta > 0:
            duration = self.load.end - now  # a replica serves until the load ends unless scaled down
            requests = replica_requests(self.spec, self.next_index, d.delta, now)
            self.next_index += d.delta
            self.live.extend(r.id for r in requests)
            self._submit = [TraceJob(r, duration) for r in requests]
        elif d.delta < 0:
            queued = [r for r in self.live if r in waiting]
            running = [r for r in self.live if r not in waiting]
            stopped = replicas_to_release(queued, running, -d.delta)
            gone = set(stopped)
            self.live = [r for r in self.live if r not in gone]
        return stopped

    def take(self, now: float) -> list[TraceJob]:
        """The replica requests a scale-up at `now` asked for."""
        if self.tick is not None and now >= self.tick:
            self.stop(now, ())  # a replay without the stop hook still ticks
        out, self._submit = self._submit, []
        return out


@dataclass(frozen=True)
class InferenceSetup:
    """One autoscaled inference service: its spec, its load series and the policy's tick."""

    spec: ServiceSpec
    load: LoadSeries
    tick_s: float = 60.0

    @property
    def peak_replicas(self) -> int:
        """The replicas the policy asks for at the load's highest point (what siloed is sized to)."""
        return max(self.spec.min_replicas, self.spec.wanted(self.load.peak()))


@dataclass
class PolicyRun:
    """What one policy did: the merged event log, the logs of each replay (pool, book, result), the
    autoscaler's decisions and the inference partition (siloed) or quota (unified) in GPUs."""

    policy: str
    events: list[Event]
    capacity_gpus: float
    inference_gpus: float
    setup: InferenceSetup
    parts: list[tuple[Pool, QuotaBook, ReplayResult]] = field(default_factory=list)
    decisions: list[ScaleDecision] = field(default_factory=list)

    @property
    def cycles(self) -> int:
        """Cycles run over all replays."""
        return sum(r.cycles for _, _, r in self.parts)


def replicas_per_node(node: Node, spec: ServiceSpec) -> int:
    """How many replicas of `spec` one node holds by GPUs, GPU memory, CPU and memory."""
    if node.model is None or node.model.memory_mib < spec.replica_gpu_memory_mib:
        return 0
    if spec.replica_gpu_milli >= MILLI_PER_GPU:
        by_gpu = node.gpus // spec.replica_gpus
    else:
        by_gpu = node.gpus * (MILLI_PER_GPU // spec.replica_gpu_milli)
        if spec.replica_gpu_memory_mib:
            by_gpu = min(by_gpu, node.gpus * (node.model.memory_mib // spec.replica_gpu_memory_mib))
    by_cpu = node.cpu_milli // spec.replica_cpu_milli if spec.replica_cpu_milli else by_gpu
    by_mem = node.memory_mib // spec.replica_memory_mib if spec.replica_memory_mib else by_gpu
    return min(by_gpu, by_cpu, by_mem)


def inference_partition(pool: Pool, setup: InferenceSetup) -> tuple[Pool, Pool]:
    """(inference nodes, training nodes): whole nodes, in name order, until they hold the peak replicas.

    If the whole pool cannot hold the peak, inference gets every node that holds a replica but one
    training node stays, so siloed training can still run (stated in `describe_partition`)."""
    need = setup.peak_replicas
    chosen: list[Node] = []
    held = 0
    for n in pool.nodes:
        if held >= need:
            break
        k = replicas_per_node(n, setup.spec)
        if k:
            chosen.append(n)
            held += k
    if len(chosen) == len(pool.nodes):
        chosen = chosen[:-1]
    names = {n.name for n in chosen}
    inference = Pool(tuple(chosen), source=f"{pool.source} (inference partition)")
    training = Pool(tuple(n for n in pool.nodes if n.name not in names), source=f"{pool.source} (training partition)")
    return inference, training


def unified_book(book: QuotaBook, tenant: str, inference_milli: int) -> QuotaBook:
    """`book` with the inference tenant's quota set to `inference_milli` (added when it is missing)."""
    tenants = dict(book.tenants)
    tenants[tenant] = inference_milli
    projects = dict(book.projects)
    projects.setdefault((tenant, "default"), None)
    return QuotaBook(tenants, projects)


def run_policy(
    policy: str,
    pool: Pool,
    book: QuotaBook,
    jobs: Sequence[TraceJob],
    setup: InferenceSetup,
    config: SchedulerConfig | None = None,
    options: ReplayOptions | None = None,
) -> PolicyRun:
    """Replay `jobs` and the autoscaled service on `pool` under `policy` (unified or siloed).

    `book` holds the training tenants; the inference tenant's quota is set to the siloed partition's
    GPUs in both policies. In siloed, the training tenants keep their quotas on the training nodes."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
    spec = setup.spec
    inference_pool, training_pool = inference_partition(pool, setup)
    inference_milli = inference_pool.gpu_milli
    capacity = pool.gpu_milli / MILLI_PER_GPU
    if policy == "unified":
        full = unified_book(book, spec.tenant, inference_milli)
        service = _service(setup, full)
        sources: list[LoadSource] = [service, TraceSource(jobs)]
        result = replay(pool, full, sources, config, options)
        return PolicyRun(
            policy,
            result.events,
            capacity,
            inference_milli / MILLI_PER_GPU,
            setup,
            [(pool, full, result)],
            service.decisions,
        )
    inference_book = QuotaBook({spec.tenant: inference_milli}, {(spec.tenant, spec.project): None})
    service = _service(setup, inference_book)
    served = replay(inference_pool, inference_book, [service], config, options)
    training_book = QuotaBook(
        {t: q for t, q in book.tenants.items() if t != spec.tenant},
        {k: q for k, q in book.projects.items() if k[0] != spec.tenant},
    )
    trained = replay(training_pool, training_book, [TraceSource(jobs)], config, options)
    events = list(heapq.merge(served.events, trained.events, key=lambda e: e["t"]))
    parts = [(inference_pool, inference_book, served), (training_pool, training_book, trained)]
    return PolicyRun(policy, events, capacity, inference_milli / MILLI_PER_GPU, setup, parts, service.decisions)


def _service(setup: InferenceSetup, book: QuotaBook) -> AutoscaledService:
    """The replay source of the service, its max replicas bounded by its tenant's cap at ratio 1.0
    (the cap every allocation level guarantees: asking past it would only queue replicas P0 may not run)."""
    spec = setup.spec
    quota = min(book.quota_of(k) or math.inf for k in book.keys_for(spec.tenant, spec.project))
    cap = None if quota == math.inf else cap_replicas(int(quota), spec.replica_gpu_milli)
    return AutoscaledService(spec, setup.load, cap, setup.tick_s)


def policy_metrics(run: PolicyRun, grid_s: float = 60.0) -> dict:
    """The metrics of a policy run (`inference_metrics.run_metrics`) over the load's span, plus what
    the load was (its source, loop) and the inference GPUs (partition or quota)."""
    from xirang_platform.simulate.inference_metrics import run_metrics

    load = run.setup.load
    grid = np.arange(load.start, load.end, grid_s)
    qps = np.array([np.nan if (q := load.at(float(t))) is None else q for t in grid])
    out = run_metrics(
        run.events, run.capacity_gpus, load.end, grid, qps, run.setup.spec.replica_qps, run.setup.spec.replica_gpu_milli
    )
    out["policy"] = run.policy
    out["inference_gpus"] = run.inference_gpus
    out["inference_load"] = load.describe()
    out["cycles"] = run.cycles
    return out
