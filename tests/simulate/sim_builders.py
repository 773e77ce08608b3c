"""Small builders for simulator tests: pools, trace jobs, CSV files and hand-made event logs.

pool(node("n0", gpus=2), node("n1", model="A100", domain="d1"))
job("a", submit=0, duration=100, gpus=1)               # a TraceJob, P2 by default
csv_file(tmp_path, "pods.csv", OPENB_HEADER, ["p0,1000,..."])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xirang_platform.pool.model import GpuModel, Node, Pool
from xirang_platform.scheduling.model import Request, Tier
from xirang_platform.scheduling.quota import QuotaBook
from xirang_platform.simulate.traces import TraceJob

MODELS = {
    "T4": GpuModel("T4", 15360, 65),
    "A100": GpuModel("A100", 81920, 312),
}

OPENB_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
ITP_HEADER = "job_id,submission_time,duration,num_gpu"


def node(
    name: str, *, model: str = "T4", gpus: int = 2, cpu: int = 64000, mem: int = 262144, domain: str = "d0"
) -> Node:
    """A GPU node with roomy CPU and memory by default."""
    return Node(name, MODELS[model], gpus, cpu, mem, domain, unit_milli=1)


def pool(*nodes: Node) -> Pool:
    """A pool of `nodes` (one two-GPU T4 node when none are given)."""
    return Pool(nodes or (node("n0"),), source="test")


def book(**tenants: float) -> QuotaBook:
    """Tenants with quotas in GPUs, each with one project `default` without a quota of its own."""
    return QuotaBook({t: round(q * 1000) for t, q in tenants.items()}, {(t, "default"): None for t in tenants})


def job(
    job_id: str,
    *,
    submit: float = 0.0,
    duration: float = 100.0,
    gpus: int = 1,
    milli: int = 1000,
    tier: str = "offline-training",
    tenant: str = "default",
    cpu: int = 1000,
    mem: int = 1024,
    single_node: bool = True,
) -> TraceJob:
    """A trace job with safe defaults: one whole GPU, P2, tenant default, 100 s of work."""
    request = Request(
        job_id,
        tenant,
        "default",
        Tier(tier),
        submit_time=submit,
        gpus=gpus,
        milli_per_gpu=milli,
        cpu_milli=cpu,
        memory_mib=mem,
        single_node=single_node,
    )
    return TraceJob(request, duration)


def csv_file(directory: Path, name: str, header: str, rows: list[str]) -> Path:
    """Write a CSV file (header on line 1) and return its path."""
    path = directory / name
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


# --- hand-made event logs ------------------------------------------------------------------------


def submit(
    t: float,
    job_id: str,
    *,
    tier: str = "offline-training",
    tenant: str = "default",
    gpus: int = 1,
    milli_per_gpu: int = 1000,
    cpu: int = 1000,
    mem: int = 1024,
    duration: float = 100.0,
) -> dict[str, Any]:
    """A submit event."""
    return {
        "t": t,
        "event": "submit",
        "job": job_id,
        "tenant": tenant,
        "project": "default",
        "tier": tier,
        "gpu_milli": gpus * milli_per_gpu,
        "cpu_milli": cpu,
        "memory_mib": mem,
        "gpus": gpus,
        "milli_per_gpu": milli_per_gpu,
        "duration_s": duration,
    }


def admit(
    t: float,
    job_id: str,
    alloc: list[tuple[str, int, int]],
    *,
    borrowed: bool = False,
    cpu: int = 1000,
    mem: int = 1024,
) -> dict[str, Any]:
    """An admit event; `alloc` is (node, gpu, milli) slices; CPU/memory sit on the first slice's node."""
    nodes = sorted({n for n, _, _ in alloc}) or ["n0"]
    return {
        "t": t,
        "event": "admit",
        "job": job_id,
        "alloc": [{"node": n, "gpu": g, "milli": m} for n, g, m in alloc],
        "borrowed": borrowed,
        "shares": [{"node": nodes[0], "cpu_milli": cpu, "memory_mib": mem}],
    }


def finish(t: float, job_id: str) -> dict[str, Any]:
    """A finish event."""
    return {"t": t, "event": "finish", "job": job_id}


def preempt(t: float, job_id: str, by: str, lost: float = 0.0, reason: str = "priority") -> dict[str, Any]:
    """A preempt event."""
    return {"t": t, "event": "preempt", "job": job_id, "by": by, "reason": reason, "lost_gpu_s": lost}


def reject(t: float, job_id: str, reason: str = "never-fits") -> dict[str, Any]:
    """A reject event."""
    return {"t": t, "event": "reject", "job": job_id, "reason": reason, "message": "m"}


def returned(t: float, job_id: str, milli: int) -> dict[str, Any]:
    """A return event."""
    return {"t": t, "event": "return", "job": job_id, "milli": milli}


# A hand-made event log on two GPUs (n0 gpu 0 and 1), read by the metrics, event-check and report tests.
# a, d, e are inference; b, c offline training.
TWO_GPU_LOG = [
    submit(0, "a", tier="inference"),
    submit(0, "b"),
    admit(0, "a", [("n0", 0, 1000)]),
    admit(10, "b", [("n0", 1, 1000)]),
    submit(20, "c", milli_per_gpu=500),
    preempt(30, "b", by="c", lost=20.0),  # b ran 10..30 on one GPU: 20 GPU-s lost
    admit(30, "c", [("n0", 1, 500)]),
    finish(40, "a"),
    admit(40, "b", [("n0", 0, 1000)]),
    submit(50, "d", tier="inference", milli_per_gpu=500),
    finish(60, "c"),
    admit(60, "d", [("n0", 1, 500)]),
    finish(80, "d"),
    submit(90, "e", tier="inference", gpus=4),
    reject(90, "e"),
    finish(100, "b"),
]
