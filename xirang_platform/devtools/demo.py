"""`xirang demo`: a scripted scenario on a temporary embedded platform, headless, through the real code.

A temporary Dagster instance (SQLite, the platform's `XirangRunCoordinator`, one process per run) and
a temporary ledger on a small pool (2 nodes x 4 H100 in one NVLink domain; research's quota 4 GPUs,
product's 6). Runs are submitted with the GraphQL mutation the UI sends and Dagster's own sensor and
queue daemon iterations drive them (`embedded.py`); every run does its real asset work.

The scenario: product deploys its model and the autoscaler starts its first serving replica;
research's offline sweeps fill the pool (two of them on borrowed capacity); product's retraining
arrives and is admitted by preempting offline work; a burst of requests (`demo_serving.py`) makes
the autoscaler scale the service up, preempting more; the load falls and the replicas end, their
capacity returns; the retrained model is deployed and rolled out replica by replica under load;
the preempted sweeps resume from their checkpoints and finish.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import DagsterInstance, DagsterRun, DagsterRunStatus

from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.control.service_scaling import REPLICA_TAG, SERVICE_TAG, STOP_TAG
from xirang_platform.dagster_defs import run_workers
from xirang_platform.devtools.demo_serving import ServingWatch, write_services
from xirang_platform.devtools.embedded import TERMINAL, Embedded, EmbeddedError, embedded_platform, write_platform
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.operations.preemption_log import victim_losses
from xirang_platform.pool.model import MILLI_PER_GPU

DEMO_POOL = {
    "schema_version": 1,
    "name": "demo",
    "nodes": [
        {
            "name": "h100-{index:02d}",
            "count": 2,
            "model": "H100-SXM",
            "gpus": 4,
            "cpu": 96,
            "memory": "1Ti",
            "domain": "nvl-a",
        }
    ],
}
DEMO_PLATFORM = {
    "pool": "pool.yaml",
    "ledger_url": "sqlite:///ledger.sqlite",
    "launcher": "local",
    "tenants": {
        "research": {"quota_gpus": 4, "projects": {"vision": {}}},
        "product": {"quota_gpus": 6, "projects": {"serving": {}}},
    },
    "locations": {"research": "research", "product": "product"},
    "autoscaling": "autoscaling.yaml",
    "tick": {"interval_s": 1, "location": "research"},
    "scheduler": {"min_runtime_s": 0, "starvation_wait_s": 600},
}
SWEEPS = 5
SWEEP = {"ops": {"research__architecture_sweep": {"config": {"widths": [16, 32], "epochs": 30, "epoch_pause_s": 1.0}}}}
TRAINING = {"ops": {"product__trained_model": {"config": {"epochs": 8, "epoch_pause_s": 0.3}}}}
# The retraining holds its GPUs through the request burst, so the scale-up must preempt offline work.
RETRAINING = {"ops": {"product__trained_model": {"config": {"epochs": 8, "epoch_pause_s": 6.0}}}}
WAITING = {DagsterRunStatus.NOT_STARTED, DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING}


@dataclass(frozen=True)
class Event:
    """One line of the timeline: seconds since the start, the run's label, what happened."""

    at: float
    run: str
    what: str


@dataclass
class Timeline:
    """What the demo saw happen to each run: submission, admission, preemption, start, end."""

    echo: Callable[[str], None] | None = None
    started: float = field(default_factory=time.monotonic)
    labels: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    _seen: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def observe(self, runs: list[DagsterRun]) -> None:
        """Add a line for each run whose status, gate or preemption mark changed since the last look."""
        for run in runs:
            self._label(run)
            state = (run.status.value, run.tags.get(rt.GATE, ""), run.tags.get(rt.PREEMPTED_BY, ""))
            before = self._seen.get(run.run_id)
            self._seen[run.run_id] = state
            if before is None:
                self._note(run.run_id, f"submitted: {_ask(run)}")
            if state[1] == rt.GATE_OPEN and (before is None or before[1] != rt.GATE_OPEN):
                self._note(run.run_id, f"admitted: {_placement(run)}")
            if state[2] and (before is None or not before[2]):
                self._note(run.run_id, f"preempted: {self._named(state[2])}")
            if (before is None or before[0] != state[0]) and run.status in (DagsterRunStatus.STARTED, *TERMINAL):
                self._note(run.run_id, run.status.value.lower())

    def _label(self, run: DagsterRun) -> None:
        if run.run_id not in self.labels:
            parent = run.tags.get(rt.PARENT_RUN)
            named = run.tags.get(REPLICA_TAG, run.job_name)
            self.labels[run.run_id] = f"{self.labels.get(parent, parent[:8])}'" if parent else named

    def _named(self, text: str) -> str:
        for run_id, label in self.labels.items():
            text = text.replace(run_id, label)
        return text

    def _note(self, run_id: str, what: str) -> None:
        event = Event(round(time.monotonic() - self.started, 1), self.labels[run_id], what)
        self.events.append(event)
        if self.echo:
            self.echo(format_event(event))


def format_event(event: Event) -> str:
    """One timeline line."""
    return f"{event.at:7.1f}s  {event.run:<13} {event.what}"


def _ask(run: DagsterRun) -> str:
    tier = run.tags.get(rt.TIER, "no GPU")
    if run.tags.get(rt.GPUS):
        return f"{tier}, {run.tags[rt.GPUS]} GPUs"
    if run.tags.get(rt.GPU_MILLI):
        return f"{tier}, {int(run.tags[rt.GPU_MILLI]) / MILLI_PER_GPU:g} GPU"
    return tier


def _placement(run: DagsterRun) -> str:
    allocation = run_allocation.read_allocation_tag(run.tags.get(rt.ALLOCATION))
    if allocation is None:
        return "no GPU"
    gpus = ", ".join(f"{n}:{g}" for n, g, _, _ in allocation.gpus)
    return f"{allocation.milli / MILLI_PER_GPU:g} GPUs on {gpus}{' (borrowed)' if allocation.borrowed else ''}"


@dataclass(frozen=True)
class DemoReport:
    """The demo's outcome: its timeline, the ledger at the end, and the counts."""

    events: list[Event]
    ledger: list[str]
    counts: dict[str, Any]


class Scenario:
    """The scripted scenario on one embedded platform."""

    def __init__(self, platform: Embedded, ledger: Ledger, timeline: Timeline, root: Path) -> None:
        self.platform = platform
        self.ledger = ledger
        self.timeline = timeline
        self.root = root
        self.serving = ServingWatch(platform.instance, root)

        def on_step() -> None:
            timeline.observe(platform.runs())
            self.serving.observe()

        platform.on_step = on_step

    def submit(
        self, label: str, location: str, job: str, run_config: dict, selection: list[list[str]] | None = None
    ) -> str:
        run_id = self.platform.submit(location, job, run_config, selection=selection)
        self.timeline.labels[run_id] = label
        self.timeline.observe(self.platform.runs())
        return run_id

    def ended(self, *run_ids: str) -> Callable[[], bool]:
        return lambda: all(self.platform.status(r) in TERMINAL for r in run_ids)

    def started(self, *run_ids: str) -> Callable[[], bool]:
        """The runs' processes are up (a run preempted while its process starts would fail, not cancel)."""
        return lambda: all(self.platform.status(r) not in WAITING for r in run_ids)

    def play(self) -> None:
        """Deploy, fill, retrain by preemption, scale up by preemption, scale down, resume, finish."""
        wait = self.platform.wait
        deploy = self.submit("deploy", "product", "lifecycle", TRAINING)
        wait("the first deployment", self.ended(deploy))
        if self.platform.status(deploy) != DagsterRunStatus.SUCCESS:
            raise EmbeddedError(f"the first deployment ended {self.platform.status(deploy).value}: see its run log")
        selection = [["research", "architecture_sweep"]]
        sweeps = [self.submit(f"sweep-{i}", "research", "__ASSET_JOB", SWEEP, selection) for i in range(1, SWEEPS + 1)]
        wait("the first serving replica", lambda: len(self.serving.ready()) == 1)
        # The pool holds three sweeps beside the replica; the others wait, so freed GPUs go back to offline work.
        wait("offline sweeps filling the pool", lambda: sum(self.started(s)() for s in sweeps) >= 3)
        retraining = self.submit("retraining", "product", "retraining", RETRAINING)
        wait("the retraining admitted by preemption", self.admitted(retraining))
        wait("no offline run starting", self.quiet)
        serving = self.serving
        serving.start_load()
        wait("the inference service scaled up", lambda: len(serving.ready()) >= 3, timeout=180)
        wait("the inference service scaled down", lambda: len(serving.ready()) == 1 and self.replicas_live() == 1)
        wait("the retraining finished", self.ended(retraining))
        self.submit("redeploy", "product", "__ASSET_JOB", {}, [["product", "inference_service"]])
        wait("the new model version rolled out", lambda: serving.deployed_version() == "2" and not serving.rolling()
             and serving.ready() == ["2"] and self.replicas_live() == 1)  # fmt: skip
        wait("the load replayed", serving.load_done, timeout=240)
        write_services(self.root, {"services": {}})  # the service is switched off: its replica ends
        for run in self.platform.runs():
            if run.tags.get(SERVICE_TAG) and not run.is_finished:
                self.platform.instance.run_coordinator.cancel_run(run.run_id)
        wait("every run finished, the preempted ones resumed", self.settled)

    def replicas_live(self) -> int:
        """The service's replica runs that have not ended."""
        return sum(1 for r in self.platform.runs() if r.tags.get(SERVICE_TAG) and not r.is_finished)

    def admitted(self, run_id: str) -> Callable[[], bool]:
        """The run's gate is open (the tick admitted it)."""

        def check() -> bool:
            run = self.platform.instance.get_run_by_id(run_id)
            return run is not None and run.tags.get(rt.GATE) == rt.GATE_OPEN

        return check

    def quiet(self) -> bool:
        """No offline run is between admission and a running process (preempted then, it would fail, not
        cancel, and not resume)."""
        return not any(
            r.status == DagsterRunStatus.STARTING and r.tags.get(rt.TIER) == "offline-training"
            for r in self.platform.runs()
        )

    def settled(self) -> bool:
        """Every run ended and every preempted run has a resumption."""
        runs = self.platform.runs()
        if any(r.status not in TERMINAL for r in runs):
            return False
        resumed = {r.tags.get(rt.PARENT_RUN) for r in runs}
        return all(r.run_id in resumed for r in runs if r.tags.get(rt.PREEMPTED_BY))

    def counts(self) -> dict[str, Any]:
        """Runs by final status, preemptions, resumptions, borrows, returns, max wait by tier, ledger state."""
        runs = self.platform.runs()
        entries = self.ledger.entries()
        by_kind = {
            kind: len({e.request_id for e in entries if e.kind == kind}) for kind in ("preempt", "borrow", "return")
        }
        waits: dict[str, float] = {}
        for run in runs:
            record = self.platform.instance.get_run_record_by_id(run.run_id)
            tier = run.tags.get(rt.TIER)
            if record is not None and record.start_time is not None and tier:
                wait = record.start_time - record.create_timestamp.timestamp()
                waits[tier] = round(max(waits.get(tier, 0.0), wait), 1)
        return {
            "runs": len(runs),
            "runs_by_status": dict(sorted(Counter(r.status.value for r in runs).items())),
            "preemptions": by_kind["preempt"],
            "resumptions": sum(1 for r in runs if r.tags.get(rt.PARENT_RUN)),
            "borrows": by_kind["borrow"],
            "returns": by_kind["return"],
            "max_wait_s_by_tier": dict(sorted(waits.items())),
            "live_allocations": len(self.ledger.allocations()),
            "ledger_consistent": self.ledger.rebuild().ok,
            **notice_counts(self.platform.instance, runs),
            "serving": {
                **self.serving.figures(),
                "replica_runs": sum(1 for r in runs if r.tags.get(SERVICE_TAG)),
                # asked to stop by a scale-down or the rollout once started: they drain and succeed
                "replicas_stopped": sum(1 for r in runs if r.tags.get(SERVICE_TAG) and STOP_TAG in r.tags),
            },
        }

    def ledger_lines(self) -> list[str]:
        """The ledger's accounts (GPUs) and its entries counted by kind."""
        lines = [f"{'account':<18}{'quota':>7}{'used':>7}{'reserved':>10}{'borrowed':>10}"]
        for v in self.ledger.accounts():
            name = v.key.tenant if v.key.project is None else f"  {v.key.tenant}/{v.key.project}"
            quota = "-" if v.quota is None else f"{v.quota / MILLI_PER_GPU:g}"
            lines.append(
                f"{name:<18}{quota:>7}{v.used / MILLI_PER_GPU:>7g}"
                f"{v.reserved / MILLI_PER_GPU:>10g}{v.borrowed / MILLI_PER_GPU:>10g}"
            )
        kinds = Counter(e.kind for e in self.ledger.entries())
        lines.append("entries: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
        return lines


def notice_counts(instance: DagsterInstance, runs: list[DagsterRun]) -> dict[str, Any]:
    """`notices`: victims that got a preemption notice and grace; `lost_gpu_seconds`: the work their
    resumptions had to redo, from the runs' own checkpoints (0 when every victim checkpointed on notice)."""
    losses = victim_losses(instance, runs)
    return {
        "notices": sum(1 for v in losses if v.grace_s is not None),
        "lost_gpu_seconds": round(sum(v.lost_gpu_seconds for v in losses), 1),
        # of which the victims that got a notice: 0 when each stopped on it (only a victim that had
        # already ended when the tick preempted it gets none)
        "lost_gpu_seconds_after_notice": round(sum(v.lost_gpu_seconds for v in losses if v.grace_s is not None), 1),
    }


def run_demo(workdir: Path | None = None, echo: Callable[[str], None] | None = None) -> DemoReport:
    """Play the scenario on a temporary platform (under `workdir`, else a fresh temporary folder)."""
    tmp = tempfile.mkdtemp(prefix="xirang-demo-")
    try:
        return _play(Path(workdir or tmp), echo)
    finally:
        remove_tree(Path(tmp))


def _play(root: Path, echo: Callable[[str], None] | None) -> DemoReport:
    """The scenario on a platform laid out under `root`."""
    config, home = write_platform(root, DEMO_PLATFORM, DEMO_POOL)
    write_services(root)
    timeline = Timeline(echo=echo)
    with embedded_platform(config, home) as platform:
        ledger = Ledger(f"sqlite:///{root / 'ledger.sqlite'}")
        try:
            scenario = Scenario(platform, ledger, timeline, root)
            scenario.play()
            platform.wait("the last releases", lambda: not ledger.allocations(), timeout=60)
            return DemoReport(timeline.events, scenario.ledger_lines(), scenario.counts())
        finally:
            ledger.close()
            # A run's process still writes its last events after its status is final: the
            # temporary instance is removed only once every one has exited.
            settle_processes(platform.instance)


def remove_tree(path: Path, timeout_s: float = 30.0) -> None:
    """Remove `path`, retrying while a code server that is shutting down still writes its last
    files there (its instance, opened for a sensor evaluation; "Directory not empty")."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def settle_processes(instance: DagsterInstance, timeout_s: float = 120.0) -> list[str]:
    """Cancel the runs still in progress and wait until every run's process has exited; the ids
    of the runs whose process still ran after `timeout_s` (empty when all exited)."""
    runs = instance.get_runs()
    for run in runs:
        if not run.is_finished:
            instance.run_coordinator.cancel_run(run.run_id)
    return run_workers.wait_ended(instance, [r.run_id for r in runs], timeout_s)
