"""The simulator's event log (DESIGN.md section 8) and a checker of the section 6 invariants on it.

One event is a JSON object with `t` (seconds of simulated time) and `event` (its kind), then the
fields DESIGN.md names, then extra fields the checker and the metrics need:

| event | DESIGN.md fields | extra fields |
|---|---|---|
| submit | job, tenant, project, tier, gpu_milli, cpu_milli, memory_mib | gpus, milli_per_gpu, duration_s |
| admit | job, alloc: [{node, gpu, milli, gpu_memory_mib}], borrowed | shares: [{node, cpu_milli, memory_mib}] |
| preempt | job, by, reason | lost_gpu_s (GPU-seconds of work thrown away) |
| notice | job, by, reason | stops_at, saves (it checkpoints before it stops) |
| reserve | job, alloc, borrowed | shares, starts_at |
| finish | job | |
| return | job | milli |
| reject | job, reason | message |
| resize | job, old_gpus, new_gpus, kind | by, reason (a shrink's); alloc, shares, borrowed (its new one); lost_gpu_s |

`gpu_milli` of a submit is the request's total (`gpus x milli_per_gpu`); an elastic request's submit
adds `gpus_min`, `gpus_max`, `gpus_step` (DESIGN.md section 11), and its admits and resizes may hold
any size of that range. Events are in time order;
at one instant the replay writes finishes, submits, then the cycle's returns, preempts, admits and
rejects. A preempted job is not submitted again: its next admit follows its preempt.

With a preemption notice (`simulate/notice.py`) a victim gets a `notice` when the cycle preempts it
and its `preempt` when it stops (`stops_at`); its units stay in use until then. Its preemptor gets a
`reserve` then (its quota is charged, its units are its own) and its `admit` when it starts. A
reservation that ends before it starts ends with a `preempt` (nothing lost) or a `finish`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling.model import Allocation, GpuRange, Request, Resize, Tier
from xirang_platform.scheduling.quota import OvercommitPolicy, QuotaBook, cap
from xirang_platform.scheduling.tiers import Preemptible

Event = dict[str, Any]
KINDS = ("submit", "admit", "preempt", "finish", "return", "reject", "notice", "reserve", "resize")


@dataclass
class EventLog:
    """Events in time order; appending an event earlier than the last one is a bug and raises."""

    events: list[Event] = field(default_factory=list)

    def _add(self, t: float, kind: str, /, **fields: Any) -> None:
        if self.events and t < self.events[-1]["t"]:
            raise ValueError(
                f"event {kind} at t={t} comes after t={self.events[-1]['t']}: the log must be in time order"
            )
        self.events.append({"t": t, "event": kind, **fields})

    def submit(self, t: float, request: Request, duration_s: float) -> None:
        """A request enters the queue."""
        self._add(
            t,
            "submit",
            job=request.id,
            tenant=request.tenant,
            project=request.project,
            tier=request.tier.value,
            gpu_milli=request.total_milli,
            cpu_milli=request.cpu_milli,
            memory_mib=request.memory_mib,
            gpus=request.gpus,
            milli_per_gpu=request.milli_per_gpu,
            duration_s=duration_s,
            **(
                {}
                if request.elastic is None
                else {
                    "gpus_min": request.elastic.min,
                    "gpus_max": request.elastic.max,
                    "gpus_step": request.elastic.step,
                }
            ),
        )

    def admit(self, t: float, allocation: Allocation) -> None:
        """A request starts on its placement."""
        self._add(t, "admit", **_placed(allocation))

    def reserve(self, t: float, allocation: Allocation, starts_at: float) -> None:
        """A preemptor's units are its own from `t`; it starts at `starts_at`, when its victims stop."""
        self._add(t, "reserve", **_placed(allocation), starts_at=starts_at)

    def notice(self, t: float, job: str, by: str, reason: str, stops_at: float, saves: bool) -> None:
        """A running allocation is told it is preempted for `by`; it stops at `stops_at`."""
        self._add(t, "notice", job=job, by=by, reason=reason, stops_at=stops_at, saves=saves)

    def preempt(self, t: float, job: str, by: str, reason: str, lost_gpu_s: float) -> None:
        """A running allocation is stopped for `by`; the request is requeued."""
        self._add(t, "preempt", job=job, by=by, reason=reason, lost_gpu_s=lost_gpu_s)

    def resize(self, t: float, resize: Resize, new: Allocation, lost_gpu_s: float) -> None:
        """An elastic run restarts at a new size on `new` (its old units are free)."""
        self._add(
            t,
            "resize",
            **_placed(new),
            old_gpus=resize.old.request.gpus,
            new_gpus=new.request.gpus,
            kind=resize.kind.value,
            by=resize.by,
            reason=None if resize.reason is None else resize.reason.value,
            lost_gpu_s=lost_gpu_s,
        )

    def finish(self, t: float, job: str) -> None:
        """A running allocation completes its work."""
        self._add(t, "finish", job=job)

    def returned(self, t: float, job: str, milli: int) -> None:
        """A borrowed allocation turns in-quota."""
        self._add(t, "return", job=job, milli=milli)

    def reject(self, t: float, job: str, reason: str, message: str) -> None:
        """A request leaves the queue for good (it can never run)."""
        self._add(t, "reject", job=job, reason=reason, message=message)

    def write(self, path: str | Path) -> None:
        """Write the log as JSON lines."""
        write_events(self.events, path)


def _placed(allocation: Allocation) -> dict[str, Any]:
    p = allocation.placement
    return {
        "job": allocation.id,
        "alloc": [
            {"node": s.node, "gpu": s.gpu, "milli": s.milli, "gpu_memory_mib": s.gpu_memory_mib} for s in p.slices
        ],
        "borrowed": allocation.borrowed,
        "shares": [{"node": s.node, "cpu_milli": s.cpu_milli, "memory_mib": s.memory_mib} for s in p.shares],
    }


def write_events(events: Iterable[Event], path: str | Path) -> None:
    """Write events as JSON lines, one object per line."""
    with Path(path).open("w", encoding="utf-8") as f:
        for e in events:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")


def read_events(path: str | Path) -> list[Event]:
    """Read a JSON-lines event log; a bad line is a ValueError naming file and line."""
    out: list[Event] = []
    with Path(path).open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not a JSON object ({err.msg}); each line must be one event") from None
            if not isinstance(e, dict) or e.get("event") not in KINDS or not isinstance(e.get("t"), int | float):
                raise ValueError(f"{path}:{n}: an event needs a numeric 't' and 'event' in {KINDS}")
            out.append(e)
    return out


# --- invariant checker --------------------------------------------------------------------------


@dataclass
class _Running:
    tier: Tier
    tenant: str
    project: str
    alloc: list[dict[str, Any]]
    shares: list[dict[str, Any]]
    borrowed: bool
    noticed: bool = False  # told it is preempted: its in-quota charge is gone, its units not yet

    @property
    def milli(self) -> int:
        return sum(int(s["milli"]) for s in self.alloc)


def check_events(
    events: Iterable[Event], pool: Pool, book: QuotaBook, policy: OvercommitPolicy | None = None, limit: int = 50
) -> list[str]:
    """Replay an event log and return the broken DESIGN.md section 6 invariants (1-3) as messages.

    1. per GPU allocated milli <= 1000 and allocated GPU memory <= the GPU model's memory; per node
       CPU and memory <= capacity;
    2. at each admit, return and growth (a `resize` to more GPUs), the in-quota (not borrowed) milli of
       every account it is charged to is within `quota x ratio`, the ratio taken at the cluster's
       allocation just before it (so an admit right after its victims' preempts is checked on the
       placement it got, victims gone); an elastic run's size stays within its range;
    3. P0 is never preempted, P1 only while borrowed, a P1 allocation is whole GPUs of one model
       in one domain (a P1 fraction of one GPU holds the whole GPU); P0 never borrows.
    Also checks the log's own consistency (time order, admit after submit, finish of a running job).
    A `reserve` is checked against quota when it is made and takes its units at its `admit`; a
    `notice` frees the victim's quota at once and its units at its `preempt`.
    Returns [] when all hold; stops after `limit` problems.
    """
    policy = policy or OvercommitPolicy()
    c = _Checker(pool, book, policy)
    for n, e in enumerate(events):
        c.step(n, e)
        if len(c.problems) >= limit:
            break
    return c.problems[:limit]


class _Checker:
    def __init__(self, pool: Pool, book: QuotaBook, policy: OvercommitPolicy) -> None:
        self.pool, self.book, self.policy = pool, book, policy
        self.nodes = {n.name: n for n in pool.nodes}
        self.capacity = pool.gpu_milli
        self.submitted: dict[str, Event] = {}
        self.done: set[str] = set()
        self.running: dict[str, _Running] = {}
        self.reserved: dict[str, _Running] = {}  # quota charged, units not yet taken
        self.gpu: dict[tuple[str, int], int] = defaultdict(int)
        self.gpu_mem: dict[tuple[str, int], int] = defaultdict(int)
        self.cpu: dict[str, int] = defaultdict(int)
        self.mem: dict[str, int] = defaultdict(int)
        self.in_quota: dict[str, int] = defaultdict(int)  # by account (tenant or tenant/project)
        self.allocated = 0
        self.last_t = float("-inf")
        self.problems: list[str] = []

    def bad(self, n: int, e: Event, what: str) -> None:
        self.problems.append(f"event {n} (t={e.get('t')}, {e.get('event')} {e.get('job')}): {what}")

    def step(self, n: int, e: Event) -> None:
        if e["t"] < self.last_t:
            self.bad(n, e, f"time goes back from {self.last_t}")
        self.last_t = e["t"]
        getattr(self, "on_" + e["event"])(n, e)

    def on_submit(self, n: int, e: Event) -> None:
        if e["job"] in self.submitted:
            self.bad(n, e, "submitted twice")
        self.submitted[e["job"]] = e

    def on_reject(self, n: int, e: Event) -> None:
        job = e["job"]
        if job not in self.submitted or job in self.running or job in self.reserved or job in self.done:
            self.bad(n, e, "rejected while not waiting")
        self.done.add(job)

    def on_admit(self, n: int, e: Event) -> None:
        job = e["job"]
        r = self.reserved.pop(job, None)
        if r is not None:
            if list(e["alloc"]) != r.alloc:
                self.bad(n, e, f"starts on {e['alloc']}, not on the units reserved for it {r.alloc}")
            if r.borrowed and not e["borrowed"]:
                self._quota(n, e, r, r.milli)  # it turned in-quota while it waited
            r.borrowed = bool(e["borrowed"])
        else:
            r = self._placed(n, e, "admitted")
            if r is None:
                return
        self._take(n, e, r, +1)
        self.running[job] = r

    def on_reserve(self, n: int, e: Event) -> None:
        r = self._placed(n, e, "reserved")
        if r is not None:
            self.reserved[e["job"]] = r

    def _placed(self, n: int, e: Event, what: str) -> _Running | None:
        """The allocation an admit or reserve gives a waiting job, its shape and quota checked."""
        job = e["job"]
        sub = self.submitted.get(job)
        if sub is None or job in self.running or job in self.reserved or job in self.done:
            self.bad(n, e, f"{what} while not waiting (no submit, already running or reserved, or finished)")
            return None
        tier = Tier(sub["tier"])
        r = _Running(
            tier, sub["tenant"], sub["project"], list(e["alloc"]), list(e.get("shares", [])), bool(e["borrowed"])
        )
        self._shape(n, e, sub, r)
        if not tier.may_borrow and r.borrowed:
            self.bad(n, e, f"P0 (inference) {what} as borrowed; P0 must fit its tenant's cap")
        if not r.borrowed:
            self._quota(n, e, r, r.milli)
        return r

    def _shape(self, n: int, e: Event, sub: Event, r: _Running) -> None:
        gpus = {(s["node"], int(s["gpu"])) for s in r.alloc}
        if "gpus_min" in sub:  # an elastic run: any size of its range
            sizes = GpuRange(int(sub["gpus_min"]), int(sub["gpus_max"]), int(sub["gpus_step"]))
            if not sizes.contains(len(gpus)) or len(r.alloc) != len(gpus):
                self.bad(n, e, f"placement holds {len(gpus)} GPUs, outside the elastic range {sizes}")
        elif len(gpus) != int(sub["gpus"]) or any(int(s["milli"]) < int(sub["milli_per_gpu"]) for s in r.alloc):
            self.bad(n, e, f"placement {r.alloc} does not give {sub['gpus']} GPUs of {sub['milli_per_gpu']} milli")
        for node, g in gpus:
            if node not in self.nodes or not 0 <= g < self.nodes[node].gpus:
                self.bad(n, e, f"no GPU {g} on node {node}")
        if r.tier.rules.whole_gpus and r.alloc:
            known = [self.nodes[s["node"]] for s in r.alloc if s["node"] in self.nodes]
            # Even a P1 request for a fraction of one GPU is placed on a whole GPU.
            if any(int(s["milli"]) != MILLI_PER_GPU for s in r.alloc):
                self.bad(n, e, "P1 allocation holds a fraction of a GPU; P1 takes whole GPUs")
            if len({x.model_name for x in known}) > 1 or len({x.domain for x in known}) > 1:
                self.bad(n, e, "P1 allocation spans GPU models or domains; P1 is one model in one domain")

    def _quota(self, n: int, e: Event, r: _Running, milli: int) -> None:
        ratio = self.policy.ratio(self.allocated / self.capacity if self.capacity else 0.0)
        for key in self.book.keys_for(r.tenant, r.project):
            name = str(key)
            limit = cap(self.book.quota_of(key), ratio)
            if self.in_quota[name] + milli > limit:
                self.bad(
                    n,
                    e,
                    f"{name} in-quota {self.in_quota[name]} + {milli} milli exceeds its cap {limit} "
                    f"(ratio {ratio:.3f})",
                )
        for key in self.book.keys_for(r.tenant, r.project):
            self.in_quota[str(key)] += milli

    def _take(self, n: int, e: Event, r: _Running, sign: int) -> None:
        for s in r.alloc:
            k = (s["node"], int(s["gpu"]))
            self.gpu[k] += sign * int(s["milli"])
            if self.gpu[k] > MILLI_PER_GPU:
                self.bad(n, e, f"GPU {k[1]} of {k[0]} holds {self.gpu[k]} milli > 1000")
            self.gpu_mem[k] += sign * int(s.get("gpu_memory_mib", 0))
            spec = self.nodes.get(k[0])
            memory = spec.model.memory_mib if spec is not None and spec.model is not None else 0
            if sign > 0 and self.gpu_mem[k] > memory:
                self.bad(n, e, f"GPU {k[1]} of {k[0]} holds {self.gpu_mem[k]} MiB of GPU memory > {memory} MiB")
        self.allocated += sign * r.milli
        for sh in r.shares:
            node = sh["node"]
            self.cpu[node] += sign * int(sh["cpu_milli"])
            self.mem[node] += sign * int(sh["memory_mib"])
            spec = self.nodes.get(node)
            if spec is None:
                self.bad(n, e, f"share on unknown node {node}")
            elif sign > 0 and (self.cpu[node] > spec.cpu_milli or self.mem[node] > spec.memory_mib):
                self.bad(
                    n,
                    e,
                    f"{node} holds {self.cpu[node]} milli-CPU / {self.mem[node]} MiB, "
                    f"capacity {spec.cpu_milli} / {spec.memory_mib}",
                )

    def _stop(self, n: int, e: Event) -> _Running | None:
        r = self.reserved.pop(e["job"], None)
        if r is None:
            r = self.running.pop(e["job"], None)
            if r is None:
                self.bad(n, e, "job is not running")
                return None
            self._take(n, e, r, -1)
        if not r.borrowed and not r.noticed:
            self._uncharge(r)
        return r

    def _uncharge(self, r: _Running) -> None:
        for key in self.book.keys_for(r.tenant, r.project):
            self.in_quota[str(key)] -= r.milli

    def on_notice(self, n: int, e: Event) -> None:
        r = self.running.get(e["job"])
        if r is None or r.noticed:
            self.bad(n, e, "notice to a job that is not running, or was told already")
            return
        self._preemptible(n, e, r)
        if not r.borrowed:
            self._uncharge(r)
        r.noticed = True

    def on_preempt(self, n: int, e: Event) -> None:
        r = self._stop(n, e)
        if r is not None and not r.noticed:
            self._preemptible(n, e, r)

    def _preemptible(self, n: int, e: Event, r: _Running) -> None:
        rules = r.tier.rules
        if rules.preemptible is Preemptible.NEVER:
            self.bad(n, e, f"{rules.level} ({r.tier.value}) preempted; {rules.level} is never preempted")
        elif not rules.preemptible_when(r.borrowed):
            self.bad(
                n, e, f"{rules.level} preempted while in quota; {rules.level} is preempted only for its borrowed part"
            )

    def on_resize(self, n: int, e: Event) -> None:
        """A running elastic run moves to a new allocation of its range: its old units and charge go,
        the new ones are checked like an admission's (capacity, shape, and for a growth the cap)."""
        job = e["job"]
        r, sub = self.running.get(job), self.submitted.get(job)
        if r is None or r.noticed or sub is None or "gpus_min" not in sub:
            self.bad(n, e, "resize of a job that is not a running elastic run")
            return
        if len(r.alloc) != int(e["old_gpus"]) or len(e["alloc"]) != int(e["new_gpus"]):
            self.bad(n, e, f"resize from {e['old_gpus']} to {e['new_gpus']} GPUs does not match the allocations")
        self._take(n, e, r, -1)
        if not r.borrowed:
            self._uncharge(r)
        old_milli = r.milli
        r.alloc, r.shares, r.borrowed = list(e["alloc"]), list(e.get("shares", [])), bool(e["borrowed"])
        self._shape(n, e, sub, r)
        if not r.borrowed and r.milli > old_milli:
            self._quota(n, e, r, r.milli)
        elif not r.borrowed:  # a shrink never adds to an overage the cap's fall made: charged, not checked
            for key in self.book.keys_for(r.tenant, r.project):
                self.in_quota[str(key)] += r.milli
        self._take(n, e, r, +1)

    def on_finish(self, n: int, e: Event) -> None:
        if self._stop(n, e) is not None:
            self.done.add(e["job"])

    def on_return(self, n: int, e: Event) -> None:
        r = self.running.get(e["job"])
        if r is None or not r.borrowed:
            self.bad(n, e, "return of an allocation that is not running borrowed")
            return
        self._quota(n, e, r, r.milli)
        r.borrowed = False


def jobs_of(events: Iterable[Event], kind: str) -> Iterator[str]:
    """The job ids of every event of `kind`, in log order."""
    return (e["job"] for e in events if e["event"] == kind)
