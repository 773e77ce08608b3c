"""Reconcile the ledger with the runs, at the start of every tick (pure: views in, repairs out).

Three writers touch one run's admission in turn (the ledger, the run's tags, Dagster's run status)
and a process can die between any two. Every tick compares them and repairs what disagrees:

- an allocation whose run is gone is released; one whose run has ended (success, failure, cancel) is
  released with the cause the release sensor writes: routine, not a repair (the tick often sees a
  short run end before the release sensor's next evaluation, and on a fresh instance that sensor
  starts from its first evaluation, missing runs that ended before it);
- a run behind the closed gate that the ledger already holds an allocation for was interrupted
  between the ledger write and the gate opening: its gate opens with the ledger's placement (or, when
  the ledger cannot say where it sits, a row older than its placements, the reservation is released
  and the run goes back to the cycle);
- a queued run whose gate is open but that holds no allocation goes back behind the gate;
- a started run that holds no allocation runs on GPUs nobody accounts for: it is stopped and requeued
  like a preempted run (its resumption continues it);
- an admitted run that started has its reservation committed (reserved becomes used);
- a resized elastic run's allocation (its new size) is kept while the run stops on its notice and
  until its resumption claims it (`resize.awaits_resumption`): neither released nor committed;
- a preemptor behind its closed gate waits while its victims use their grace, and launches (its gate
  opens with the ledger's placement, routinely, not as a repair) once they stopped or the grace ended;
- a run in progress (STARTING, STARTED, CANCELING) with no live worker has ended, whatever Dagster's
  status says: its worker is gone (killed, its host crashed), it is still STARTING past the start
  timeout with no worker seen, or still CANCELING past the cancel timeout with no live worker seen.
  It is ended (failed, or cancelled when it was cancelling) and its allocation released. A worker
  the tick cannot see (another host, a Kubernetes Job) is left to Dagster's run monitoring, which
  checks it through the run launcher.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from xirang_platform.control import run_tags as rt
from xirang_platform.scheduling.model import Allocation

QUEUED = "QUEUED"
RUNNING = ("STARTING", "STARTED")
CANCELING = "CANCELING"
IN_PROGRESS = (*RUNNING, CANCELING)
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
# The `release` cause of a run that ended, per its status: the release sensors' and reconcile's alike.
ENDED_CAUSE = {"SUCCESS": "finished", "FAILURE": "failed", "CANCELED": "canceled"}
WORKER_GONE = "its run worker is gone (killed, or its host crashed)"
# A preemptor behind its closed gate while its victims use their grace (`sensors/notices.py`).
AFTER_NOTICE_WAITING = "waiting"
AFTER_NOTICE_OVER = "over"


@dataclass(frozen=True)
class RunView:
    """What reconcile needs of a run: status (Dagster's name), gate tag, whether it asks for GPUs,
    seconds since its status last changed, and whether its worker process lives (None: unknown,
    e.g. a worker on another host)."""

    run_id: str
    status: str
    gate: str
    asks_gpus: bool
    age_s: float = 0.0
    worker: bool | None = None
    after_notice: str = ""  # a preemptor's wait for its victims: '', AFTER_NOTICE_WAITING or AFTER_NOTICE_OVER
    awaits_resumption: bool = False  # resized: its allocation is held for its resumption (`resize.py`)


@dataclass(frozen=True)
class Bounds:
    """How long a run may stay STARTING, or CANCELING, with no live worker seen (Dagster's run
    monitoring `start_timeout_seconds` and `cancel_timeout_seconds`)."""

    start_s: float = 180.0
    cancel_s: float = 180.0


@dataclass
class Repairs:
    """What one reconcile pass found, each with the run id (and for people, why)."""

    release: dict[str, str] = field(default_factory=dict)  # run -> why its allocation is released
    release_ended: dict[str, str] = field(default_factory=dict)  # ended run -> its release cause (routine)
    open_gate: list[str] = field(default_factory=list)  # admitted in the ledger, gate still closed
    close_gate: list[str] = field(default_factory=list)  # gate open, nothing held
    stop: list[str] = field(default_factory=list)  # running with nothing held
    commit: list[str] = field(default_factory=list)  # started: reserved becomes used
    end: dict[str, str] = field(default_factory=dict)  # run -> why it has ended though Dagster says not
    after_notice: list[str] = field(default_factory=list)  # preemptors whose victims stopped: launch (routine)

    @property
    def count(self) -> int:
        """Repairs found (commits and the releases of ended runs are routine, not repairs)."""
        return len(self.release) + len(self.open_gate) + len(self.close_gate) + len(self.stop) + len(self.end)

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
        out += [f"ended run {r}: {why}" for r, why in sorted(self.end.items())]
        return out


def has_ended(run: RunView, bounds: Bounds) -> str | None:
    """Why a run Dagster shows in progress has in fact ended (no live worker), or None."""
    if run.status not in IN_PROGRESS or run.worker is True:
        return None
    if run.worker is False:
        return WORKER_GONE
    if run.status == "STARTING" and run.age_s > bounds.start_s:
        return f"it did not start within {bounds.start_s:g} s"
    if run.status == CANCELING and run.age_s > bounds.cancel_s:
        return f"it did not finish cancelling within {bounds.cancel_s:g} s"
    return None


def has_placement(allocation: Allocation) -> bool:
    """Whether the ledger knows where `allocation` sits (every slice names a node)."""
    return bool(allocation.placement.slices) and all(s.node for s in allocation.placement.slices)


def plan_repairs(allocations: Sequence[Allocation], runs: Mapping[str, RunView], bounds: Bounds = Bounds()) -> Repairs:
    """Compare the ledger's live allocations with the runs' states and list the repairs."""
    repairs = Repairs(end={rid: why for rid, r in sorted(runs.items()) if (why := has_ended(r, bounds)) is not None})
    held = {a.id: a for a in allocations}
    for rid, a in sorted(held.items()):
        run = runs.get(rid)
        if run is None:
            repairs.release[rid] = "its run does not exist"
        elif run.awaits_resumption:
            continue  # the new size of a resized run, held for its resumption
        elif rid in repairs.end:
            repairs.release[rid] = repairs.end[rid]
        elif run.status in FINISHED:
            repairs.release_ended[rid] = ENDED_CAUSE[run.status]
        elif run.status == QUEUED and rt.is_closed(run.gate):
            if run.after_notice == AFTER_NOTICE_WAITING:
                continue  # its units are held for it while its victims use their grace
            if run.after_notice == AFTER_NOTICE_OVER:
                repairs.after_notice.append(rid)
            elif has_placement(a):
                repairs.open_gate.append(rid)
            else:
                repairs.release[rid] = "admission was interrupted before the gate opened; the run is cycled again"
        elif run.status in RUNNING and not a.confirmed:
            repairs.commit.append(rid)
    for rid, run in sorted(runs.items()):
        if rid in held or rid in repairs.end or not run.asks_gpus or run.gate != rt.GATE_OPEN:
            continue
        if run.status == QUEUED:
            repairs.close_gate.append(rid)
        elif run.status in RUNNING:
            repairs.stop.append(rid)
    return repairs
