"""What each preempted run lost, read from its own event log (issue 23 item 4: the demo's
`lost_gpu_seconds` and `notices`, the run page's story of its notice).

A victim's log holds its notice (the tick's engine event), the checkpoints it saved
(`GpuPoolResource.checkpointed`, and every asset it materialized), whether it stopped on the notice
(`GpuPoolResource.stop_on_notice`) or was killed when its grace ended. The work a resumption redoes
is the GPU-seconds between its last checkpoint (else its first step's start) and when it stopped;
none when it stopped right after the checkpoint it saved on its notice, or before any step started.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dagster import DagsterEventType, DagsterInstance, DagsterRun

from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.control.notice import read_notice
from xirang_platform.pool.model import MILLI_PER_GPU

CHECKPOINT_SAID = "checkpoint saved"  # `GpuPoolResource.checkpointed`'s line
STOPPED_ON_NOTICE = "preemption notice taken:"  # `GpuPoolResource.stop_on_notice`'s line


@dataclass(frozen=True)
class VictimLoss:
    """One preempted run: its GPUs, its notice's grace (None: stopped at once), whether it stopped on
    its notice, and the GPU-seconds its resumption redoes."""

    run_id: str
    gpus: float
    grace_s: float | None
    stopped_on_notice: bool
    lost_gpu_seconds: float


def victim_loss(instance: DagsterInstance, run: DagsterRun) -> VictimLoss:
    """What preempted run `run` lost, from its event log and its allocation tag."""
    held = run_allocation.read_allocation_tag(run.tags.get(rt.ALLOCATION))
    gpus = held.milli / MILLI_PER_GPU if held is not None else 0.0
    notice = read_notice(run.tags)
    entries = instance.all_logs(run.run_id)
    record = instance.get_run_record_by_id(run.run_id)
    # Work begins with the first step: a victim stopped before any step started did none to redo.
    steps = [
        e.timestamp
        for e in entries
        if e.dagster_event is not None and e.dagster_event.event_type == DagsterEventType.STEP_START
    ]
    saved = [
        e.timestamp
        for e in entries
        if CHECKPOINT_SAID in (e.message or "")
        or (e.dagster_event is not None and e.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION)
    ]
    on_notice = any(STOPPED_ON_NOTICE in (e.message or "") for e in entries)
    end = (
        record.end_time if record is not None and record.end_time else max((e.timestamp for e in entries), default=0.0)
    )
    since = max([*saved, min(steps, default=end)])
    lost = 0.0 if on_notice else max(0.0, end - since) * gpus
    return VictimLoss(run.run_id, gpus, notice.grace_s if notice else None, on_notice, round(lost, 1))


def victim_losses(instance: DagsterInstance, runs: Iterable[DagsterRun]) -> list[VictimLoss]:
    """`victim_loss` of every preempted run among `runs` (marked `xirang/preempted-by`), by run id."""
    return [victim_loss(instance, r) for r in sorted(runs, key=lambda r: r.run_id) if r.tags.get(rt.PREEMPTED_BY)]
