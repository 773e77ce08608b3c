"""Reconcile the ledger with the runs, at the start of every tick (pure: views in, repairs out).

Three writers touch one run's admission in turn (the ledger, the run's tags, Dagster's run status)
and a process can die between any two. Every tick compares them and repairs what disagrees:

- an allocation whose run is finished (or gone) is released: a release sensor missed it;
- a run behind the closed gate that the ledger already holds an allocation for was interrupted
  between the ledger write and the gate opening: its gate opens with the ledger's placement (or, when
  the ledger cannot say where it sits, a row older than its placements, the reservation is released
  and the run goes back to the cycle);
- a queued run whose gate is open but that holds no allocation goes back behind the gate;
- a started run that holds no allocation runs on GPUs nobody accounts for: it is stopped and requeued
  like a preempted run (its resumption continues it);
- an admitted run that started has its reservation committed (reserved becomes used).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xirang_platform.scheduling.model import Allocation

QUEUED = "QUEUED"
RUNNING = ("STARTING", "STARTED")
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")


@dataclass(frozen=True)
class RunView:
    """What reconcile needs of a run: status (Dagster's name), gate tag, whether it asks for GPUs."""

    run_id: str
    status: str
    gate: str
    asks_gpus: bool


@dataclass
class Repairs:
    """What one reconcile pass found, each with the run id (and for people, why)."""

    release: dict[str, str] = field(default_factory=dict)  # run -> why its allocation is released
    open_gate: list[str] = field(default_factory=list)  # admitted in the ledger, gate still closed
    close_gate: list[str] = field(default_factory=list)  # gate open, nothing held
    stop: list[str] = field(default_factory=list)  # running with nothing held
    commit: list[str] = field(default_factory=list)  # started: reserved becomes used

    @property
    def count(self) -> int:
        """Repairs found (commits are routine, not repairs)."""
        return len(self.release) + len(self.open_gate) + len(self.close_gate) + len(self.stop)

    def lines(self) -> list[str]:
        """One line per repair, for the tick's log."""
        out = [f"released the allocation of run {r}: {why}" for r, why in sorted(self.release.items())]
        out += [
            f"opened the gate of run {r}: the ledger held its allocation but the gate was closed"
            for r in self.open_gate
        ]
        out += [f"closed the gate of run {r}: it was open with no allocation in the ledger" for r in self.close_gate]
        out += [
            f"stopped run {r}: it ran with no allocation in the ledger; its resumption requeues it" for r in self.stop
        ]
        return out


def has_placement(allocation: Allocation) -> bool:
    """Whether the ledger knows where `allocation` sits (every slice names a node)."""
    return bool(allocation.placement.slices) and all(s.node for s in allocation.placement.slices)


def plan_repairs(allocations: Sequence[Allocation], runs: Mapping[str, RunView]) -> Repairs:
    """Compare the ledger's live allocations with the runs' states and list the repairs."""
    repairs = Repairs()
    held = {a.id: a for a in allocations}
    for rid, a in sorted(held.items()):
        run = runs.get(rid)
        if run is None:
            repairs.release[rid] = "its run does not exist"
        elif run.status in FINISHED:
            repairs.release[rid] = f"its run ended ({run.status.lower()}) without a release"
        elif run.status == QUEUED and run.gate == "closed":
            if has_placement(a):
                repairs.open_gate.append(rid)
            else:
                repairs.release[rid] = "admission was interrupted before the gate opened; the run is cycled again"
        elif run.status in RUNNING and not a.confirmed:
            repairs.commit.append(rid)
    for rid, run in sorted(runs.items()):
        if rid in held or not run.asks_gpus or run.gate != "open":
            continue
        if run.status == QUEUED:
            repairs.close_gate.append(rid)
        elif run.status in RUNNING:
            repairs.stop.append(rid)
    return repairs
