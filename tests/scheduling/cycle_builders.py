"""Small builders and one harness for scheduler-cycle tests.

    job("a").gpus(8).tier("online-training").build()
    node("n0").model("H100").gpus(8).domain("d0")
    running(job("v").gpus(2), on={"n0": [0, 1]}, start=0)

`run_case` runs one cycle and projects its result to plain dicts, so a table case compares the
whole outcome (admits with their GPUs, preemptions with reasons, holds with reasons, returns) at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.model import Allocation, GpuRange, GpuSlice, NodeShare, Placement, Request, Tier
from xirang_platform.scheduling.quota import AccountKey, OvercommitPolicy, QuotaBook
from xirang_platform.scheduling.snapshot import SchedulerConfig, Snapshot

MODELS = {
    "H100": GpuModel("H100", 81559, 989),
    "A100": GpuModel("A100", 81920, 312),
    "L40S": GpuModel("L40S", 46068, 362),
    "A10": GpuModel("A10", 23028, 125),
    "T4": GpuModel("T4", 15360, 65),
}


class JobBuilder:
    """Fluent builder of a `Request` with safe defaults: tenant acme/default, P2, one whole GPU."""

    def __init__(self, job_id: str) -> None:
        self._r = Request(job_id, "acme", "default", Tier.OFFLINE_TRAINING, submit_time=0.0, gpus=1)

    def gpus(self, n: int) -> JobBuilder:
        self._r = replace(self._r, gpus=n)
        return self

    def milli(self, m: int) -> JobBuilder:
        self._r = replace(self._r, gpus=1, milli_per_gpu=m)
        return self

    def tier(self, t: str) -> JobBuilder:
        self._r = replace(self._r, tier=Tier(t))
        return self

    def tenant(self, t: str, project: str = "default") -> JobBuilder:
        self._r = replace(self._r, tenant=t, project=project)
        return self

    def at(self, t: float) -> JobBuilder:
        self._r = replace(self._r, submit_time=t)
        return self

    def cpu(self, milli: int) -> JobBuilder:
        self._r = replace(self._r, cpu_milli=milli)
        return self

    def gpu_memory(self, mib: int) -> JobBuilder:
        self._r = replace(self._r, gpu_memory_mib=mib)
        return self

    def models(self, *names: str) -> JobBuilder:
        self._r = replace(self._r, gpu_models=frozenset(names))
        return self

    def level(self, lvl: int) -> JobBuilder:
        self._r = replace(self._r, min_compute_level=lvl)
        return self

    def one_node(self) -> JobBuilder:
        self._r = replace(self._r, single_node=True)
        return self

    def resumed(self, times: int = 1) -> JobBuilder:
        self._r = replace(self._r, preempted=times)
        return self

    def reclaimed(self, at: float) -> JobBuilder:
        """A request whose borrowed run was reclaimed at `at` (it waits to resume)."""
        self._r = replace(self._r, preempted=self._r.preempted + 1, reclaimed_at=at, reclaims=self._r.reclaims + 1)
        return self

    def elastic(self, low: int, high: int, step: int = 1, now: int | None = None) -> JobBuilder:
        """An elastic run of `low`..`high` GPUs asking `now` (default: its largest, as pending)."""
        self._r = replace(self._r, gpus=high if now is None else now, elastic=GpuRange(low, high, step))
        return self

    def build(self) -> Request:
        return self._r


def job(job_id: str) -> JobBuilder:
    """A request builder."""
    return JobBuilder(job_id)


@dataclass
class NodeBuilder:
    """Fluent builder of a `Node`: 8 H100s in domain d0 by default, unit 1000."""

    name: str
    _model: str = "H100"
    _gpus: int = 8
    _domain: str = "d0"
    _cpu: int = 128_000
    _mem: int = 1_024_000
    _unit: int = 1000

    def model(self, m: str) -> NodeBuilder:
        self._model = m
        return self

    def gpus(self, n: int) -> NodeBuilder:
        self._gpus = n
        return self

    def domain(self, d: str) -> NodeBuilder:
        self._domain = d
        return self

    def cpu(self, milli: int) -> NodeBuilder:
        self._cpu = milli
        return self

    def unit(self, milli: int) -> NodeBuilder:
        self._unit = milli
        return self

    def build(self) -> Node:
        return Node(
            self.name, MODELS[self._model], self._gpus, self._cpu, self._mem, self._domain, unit_milli=self._unit
        )


def node(name: str) -> NodeBuilder:
    """A node builder."""
    return NodeBuilder(name)


def running(
    builder: JobBuilder, on: dict[str, list[int]], start: float = 0.0, borrowed: bool = False, milli: int | None = None
) -> Allocation:
    """A running allocation of `builder`'s request on the given node -> GPU indices."""
    r = builder.build()
    per_gpu = milli if milli is not None else r.milli_per_gpu
    total = sum(len(g) for g in on.values()) or 1
    slices = tuple(GpuSlice(n, g, per_gpu, r.gpu_memory_mib) for n, gs in on.items() for g in gs)
    shares = tuple(
        NodeShare(n, r.cpu_milli * len(gs) // total, r.memory_mib * len(gs) // total) for n, gs in on.items()
    )
    return Allocation(r, Placement(slices, shares), start=start, borrowed=borrowed)


def quotas(tenants: dict[str, float], projects: dict[tuple[str, str], float | None] | None = None) -> QuotaBook:
    """A quota book from GPU amounts; every tenant gets a `default` project without a limit of its own."""
    proj: dict[tuple[str, str], int | None] = {(t, "default"): None for t in tenants}
    for key, q in (projects or {}).items():
        proj[key] = None if q is None else int(q * 1000)
    return QuotaBook({t: int(q * 1000) for t, q in tenants.items()}, proj)


@dataclass
class Case:
    """One table row: the pool, what runs, what waits, and the whole expected outcome."""

    nodes: list[NodeBuilder]
    pending: list[JobBuilder]
    running: list[Allocation] = field(default_factory=list)
    book: QuotaBook | None = None
    now: float = 1_000.0
    config: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(min_runtime_s=600))
    want_admit: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    want_borrowed: set[str] = field(default_factory=set)
    want_preempt: dict[str, tuple[str, str]] = field(default_factory=dict)
    want_hold: dict[str, str] = field(default_factory=dict)
    want_return: list[str] = field(default_factory=list)
    want_reserved_for: str | None = None
    want_milli: dict[str, int] = field(default_factory=dict)  # GPU milli held by these admits
    lasting_idle: dict[str, float] | None = None  # GPUs of each tenant's quota idle for `lend_after_s`
    idle_ahead: dict[str, float] | None = None  # GPUs of each tenant's idle quota forecast to stay idle


def snapshot_of(case: Case) -> Snapshot:
    """The case's snapshot (one tenant owning the pool unless the case names a quota book)."""
    pool = Pool(tuple(n.build() for n in case.nodes))
    book = case.book or QuotaBook({"acme": pool.gpu_milli}, {("acme", "default"): None})
    snapshot = Snapshot.build(pool, case.running, book)

    def milli(gpus: dict[str, float] | None) -> dict[AccountKey, int] | None:
        return None if gpus is None else {AccountKey(t): int(g * 1000) for t, g in gpus.items()}

    return replace(snapshot, lasting_idle=milli(case.lasting_idle), idle_ahead=milli(case.idle_ahead))


def gpus_by_node(placement: Placement) -> dict[str, list[int]]:
    """A placement's GPU indices per node, in slice order."""
    per_node: dict[str, list[int]] = {}
    for s in placement.slices:
        per_node.setdefault(s.node, []).append(s.gpu)
    return per_node


def outcome(case: Case) -> dict:
    """Run one cycle and project its result to plain data."""
    result = cycle(snapshot_of(case), [b.build() for b in case.pending], case.now, case.config)
    admit = {a.request_id: gpus_by_node(a.allocation.placement) for a in result.admits}
    return {
        "admit": admit,
        "borrowed": {a.request_id for a in result.admits if a.allocation.borrowed},
        "preempt": {p.victim.id: (p.by, p.reason.value) for p in result.preempts},
        "hold": {h.request_id: h.reason.value for h in result.holds},
        "return": [r.request_id for r in result.returns],
        "reserved_for": result.reserved_for,
        "milli": {a.request_id: a.allocation.milli for a in result.admits if a.request_id in case.want_milli},
    }


def expected(case: Case) -> dict:
    """The case's expectations in the shape `outcome` returns."""
    return {
        "admit": case.want_admit,
        "borrowed": case.want_borrowed,
        "preempt": case.want_preempt,
        "hold": case.want_hold,
        "return": case.want_return,
        "reserved_for": case.want_reserved_for,
        "milli": case.want_milli,
    }


OVERCOMMIT = OvercommitPolicy()
