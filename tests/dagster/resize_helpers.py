"""Resizes decided by hand, applied through the tick's own ledger write and run step: the platform's
side of a `Resize` before (and beside) the core's cycle deciding one."""

from __future__ import annotations

from dataclasses import replace

from sensors.scheduling_tick import TickReport, act_on_plan
from tests.dagster.engine_harness import Engine
from xirang_platform.control.tick_ledger import write_ledger
from xirang_platform.control.tick_plan import TickPlan
from xirang_platform.launch.launcher import platform_launcher
from xirang_platform.scheduling.model import Allocation, GpuSlice, Resize, ResizeKind
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot


def at_size(a: Allocation, gpus: int) -> Allocation:
    """`a` at `gpus` GPUs: the first `gpus` GPUs of its first node, unconfirmed (as a cycle decides it)."""
    node = a.placement.slices[0].node
    memory = a.placement.slices[0].gpu_memory_mib
    slices = tuple(GpuSlice(node, g, 1000, memory) for g in range(gpus))
    request = replace(a.request, gpus=gpus)
    return replace(a, request=request, placement=replace(a.placement, slices=slices), confirmed=False)


def resize(e: Engine, run_id: str, gpus: int, kind: ResizeKind, now: float) -> TickReport:
    """Resize run `run_id`'s allocation to `gpus` GPUs as a tick would carry out a cycle's `Resize`:
    the ledger write, then the run step (its notice). The report of that step."""
    held = {a.id: a for a in e.ledger.allocations()}
    old = held[run_id]
    result = CycleResult(resizes=(Resize(old, at_size(old, gpus), kind, now),))
    platform = e.gpu_pool.platform()
    snapshot = Snapshot.build(platform.pool, list(held.values()), e.ledger.quota_book())
    plan = TickPlan(snapshot, (), result)
    assert write_ledger(e.ledger, plan) is None
    report = TickReport()
    launcher = platform_launcher(platform.launcher)
    act_on_plan(e.instance, e.ledger, launcher, platform, plan, {}, now, report)
    return report
