"""The pool's capacity as the ledger checks it (DESIGN.md section 6, invariant 1; defence in depth).

The scheduling cycle never asks for a placement past capacity; the ledger refuses one anyway, in
the transaction that would write it: per GPU, the live allocations' slices may hold at most 1000
milli and at most the GPU model's memory; per node, their shares at most the node's CPU and memory.
Usage is the sum over the live allocations' stored placements, read after the transaction took the
pool's capacity lock (`lock_capacity`), so two writers placing on one GPU take turns and the second
sees the first one's slices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import Connection, func, select, text

from xirang_platform.ledger.tables import ALLOCATIONS, SHARES, SLICES, AllocState
from xirang_platform.pool.model import MILLI_PER_GPU, Node, Pool
from xirang_platform.scheduling.model import Placement

CAPACITY_LOCK_CLASS = 0x58524E43  # advisory lock class of the pool's capacity ("XRNC"); the key is the schema


def lock_capacity(conn: Connection) -> None:
    """Take the pool's capacity lock until the transaction ends (PostgreSQL: a transaction advisory
    lock keyed by the schema, bounded by `lock_timeout`; SQLite: `BEGIN IMMEDIATE` already holds
    the database's write lock). Take it before any tenant's accounts: the global lock order."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:cls, hashtext(current_schema()))"), {"cls": CAPACITY_LOCK_CLASS}
        )


@dataclass
class Usage:
    """What placements hold: per (node, GPU) milli and GPU memory, per node CPU and memory."""

    gpu_milli: dict[tuple[str, int], int] = field(default_factory=dict)
    gpu_memory_mib: dict[tuple[str, int], int] = field(default_factory=dict)
    cpu_milli: dict[str, int] = field(default_factory=dict)
    memory_mib: dict[str, int] = field(default_factory=dict)

    def add(self, placement: Placement, sign: int = 1) -> None:
        """Count `placement` in (or, with `sign` -1, out of) the usage."""
        for s in placement.slices:
            key = (s.node, s.gpu)
            self.gpu_milli[key] = self.gpu_milli.get(key, 0) + sign * s.milli
            self.gpu_memory_mib[key] = self.gpu_memory_mib.get(key, 0) + sign * s.gpu_memory_mib
        for sh in placement.shares:
            self.cpu_milli[sh.node] = self.cpu_milli.get(sh.node, 0) + sign * sh.cpu_milli
            self.memory_mib[sh.node] = self.memory_mib.get(sh.node, 0) + sign * sh.memory_mib


def live_usage(conn: Connection) -> Usage:
    """The usage of every live allocation's stored placement (two grouped queries)."""
    live = ALLOCATIONS.c.state != AllocState.RELEASED.value
    usage = Usage()
    slices = (
        select(SLICES.c.node, SLICES.c.gpu, func.sum(SLICES.c.milli), func.sum(SLICES.c.gpu_memory_mib))
        .join(ALLOCATIONS, ALLOCATIONS.c.id == SLICES.c.allocation_id)
        .where(live)
        .group_by(SLICES.c.node, SLICES.c.gpu)
    )
    for node, gpu, milli, memory in conn.execute(slices):
        usage.gpu_milli[(node, gpu)] = int(milli)
        usage.gpu_memory_mib[(node, gpu)] = int(memory)
    shares = (
        select(SHARES.c.node, func.sum(SHARES.c.cpu_milli), func.sum(SHARES.c.memory_mib))
        .join(ALLOCATIONS, ALLOCATIONS.c.id == SHARES.c.allocation_id)
        .where(live)
        .group_by(SHARES.c.node)
    )
    for node, cpu, memory in conn.execute(shares):
        usage.cpu_milli[node] = int(cpu)
        usage.memory_mib[node] = int(memory)
    return usage


def over_capacity(pool: Pool, usage: Usage, only: Placement | None = None) -> list[str]:
    """Where `usage` passes the pool's capacity, as messages naming the GPU or node and the amounts,
    in node, GPU order; with `only`, just on the GPUs and nodes that placement touches. A slice or
    share on a node or GPU the pool does not have is over capacity too (its capacity is 0)."""
    return _problems({n.name: n for n in pool.nodes}, usage, only)


def _problems(nodes: Mapping[str, Node], usage: Usage, only: Placement | None) -> list[str]:
    gpus = sorted({(s.node, s.gpu) for s in only.slices} if only is not None else set(usage.gpu_milli))
    hosts = sorted({sh.node for sh in only.shares} if only is not None else set(usage.cpu_milli))
    problems = []
    for name, gpu in gpus:
        node = nodes.get(name)
        milli, memory = usage.gpu_milli.get((name, gpu), 0), usage.gpu_memory_mib.get((name, gpu), 0)
        if node is None or node.model is None or not 0 <= gpu < node.gpus:
            if milli > 0:
                problems.append(f"GPU {gpu} of node '{name}' is not in the pool, yet {milli} milli are placed on it")
            continue
        if milli > MILLI_PER_GPU:
            problems.append(f"GPU {gpu} of node '{name}' would hold {milli} milli, past its {MILLI_PER_GPU}")
        if memory > node.model.memory_mib:
            limit = node.model.memory_mib
            problems.append(f"GPU {gpu} of node '{name}' would hold {memory} MiB of GPU memory, past its {limit} MiB")
    for name in hosts:
        host = nodes.get(name)
        cpu, memory = usage.cpu_milli.get(name, 0), usage.memory_mib.get(name, 0)
        cpu_cap, memory_cap = (host.cpu_milli, host.memory_mib) if host is not None else (0, 0)
        if cpu > cpu_cap:
            problems.append(f"node '{name}' would hold {cpu} CPU milli, past its {cpu_cap}")
        if memory > memory_cap:
            problems.append(f"node '{name}' would hold {memory} MiB of memory, past its {memory_cap} MiB")
    return problems


class CapacityCheck:
    """The pool's free capacity inside one ledger transaction: each `take` of an admission's
    placement either fits (and is counted) or names why not (and changes nothing)."""

    def __init__(self, pool: Pool, usage: Usage) -> None:  # noqa: D107
        self.nodes = {n.name: n for n in pool.nodes}
        self.usage = usage

    def take(self, placement: Placement) -> str:
        """Count `placement` if it fits the GPUs and nodes it touches; else why not ('' if it fit)."""
        self.usage.add(placement)
        problems = _problems(self.nodes, self.usage, placement)
        if problems:
            self.usage.add(placement, -1)
        return "; ".join(problems)
