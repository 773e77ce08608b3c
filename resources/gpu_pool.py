"""`GpuPoolResource`: the platform as Dagster code sees it (DESIGN.md section 7).

One `ConfigurableResource` built from the platform config (`xirang.yaml`): the pool inventory, the
ledger, the scheduler config and the launcher choice. The scheduling tick and the release sensors
read the pool and the ledger through it; ops read their own allocation through it:

```python
@asset(tags={"xirang/tier": "online-training", "xirang/gpus": "2"})
def trained_model(context: AssetExecutionContext, gpu_pool: GpuPoolResource) -> None:
    alloc = gpu_pool.allocation(context)     # RunAllocation: node, device_ids(), milli, borrowed
    context.log.info(f"training on {alloc.node} GPUs {alloc.device_ids()}")
```

A training loop reports its checkpoints and takes its preemption notice through it (issue 23):

```python
with gpu_pool.on_preemption(context):            # the run's termination is now its notice
    for epoch in range(start, epochs):
        train_one_epoch(); save_checkpoint(epoch)
        gpu_pool.checkpointed(context, step=epoch)  # victim cost: the work since this
        if gpu_pool.preemption_requested(context):
            gpu_pool.stop_on_notice(context, step=epoch)  # logs the grace used, ends the run cancelled
```

When a run starts, the resource gives the run worker process the environment of its allocation
(`CUDA_VISIBLE_DEVICES`, `XIRANG_ALLOCATION`, local launcher), and a run that holds no allocation an
empty `CUDA_VISIBLE_DEVICES`, so it sees no GPU.

Trust boundary (DESIGN.md section 7): the platform settings (`config_path`, `ledger_url`) come from
the deployment: the Definitions' construction, else `XIRANG_CONFIG`. Dagster exposes a
`ConfigurableResource`'s fields to run config, so a run whose run config sets them fails before
its first step, naming the field; and only sensors (the deployment's processes) bring the ledger's
accounts in line with the platform config, never a run worker.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dagster import (
    AssetExecutionContext,
    ConfigurableResource,
    DagsterInstance,
    DagsterRun,
    InitResourceContext,
    OpExecutionContext,
)
from pydantic import Field, PrivateAttr

from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.control.accounts import sync_accounts
from xirang_platform.control.live_config import ConfigReading, read_live
from xirang_platform.control.notice import Notice, read_notice
from xirang_platform.control.platform_config import PlatformConfig
from xirang_platform.control.pool_state import PoolState, pool_state
from xirang_platform.dagster_compat import (
    DagsterExecutionInterruptedError,  # what Dagster's termination raises
    held_filter,
)
from xirang_platform.launch.local import NO_GPU_ENVIRONMENT, apply_environment
from xirang_platform.ledger.db import ledger_url
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.quota import OvercommitPolicy

StepContext = AssetExecutionContext | OpExecutionContext  # what an asset's or an op's body is given
RunOrContext = StepContext | DagsterRun


class GpuPoolResource(ConfigurableResource):
    """The shared GPU pool: inventory, ledger, scheduler config and launcher, from the platform config.

    Examples:
        `Definitions(..., resources={"gpu_pool": GpuPoolResource(config_path="xirang.yaml")})`;
        in an op or asset, `gpu_pool.allocation(context)` is the run's allocation.
    """

    config_path: str = Field(
        default="", description="Path of the platform config (xirang.yaml); empty: XIRANG_CONFIG, else ./xirang.yaml."
    )
    ledger_url: str = Field(default="", description="Overrides the platform config's ledger URL when set.")
    _in_run: bool = PrivateAttr(default=False)  # in a run worker: never sync accounts

    def platform(self) -> PlatformConfig:
        """The platform config in force: the file's, or its last good one while an edit is bad (`live_config`)."""
        return self.platform_reading().config

    def platform_reading(self) -> ConfigReading:
        """The platform config in force and why the file as it is now is not (None: it is)."""
        return read_live(self.config_path or None)

    def pool(self) -> Pool:
        """The pool inventory."""
        return self.platform().pool

    @property
    def launcher(self) -> str:
        """`local` or `k8s`, from the platform config."""
        return self.platform().launcher

    def ledger(self) -> Ledger:
        """The quota ledger, its tenants and projects brought in line with the platform config."""
        reading = self.platform_reading()
        platform = reading.config
        url = ledger_url(self.ledger_url or platform.ledger_url or None)
        ledger = _ledger(url, platform.overcommit)
        if not self._in_run and (url, platform.source, reading.generation) not in _SYNCED:
            sync_accounts(ledger, platform.book)
            _SYNCED.add((url, platform.source, reading.generation))
        return ledger

    def allocation(self, context: RunOrContext) -> run_allocation.RunAllocation | None:
        """The allocation of the run `context` belongs to (an op's or asset's context, or a run),
        or None for a run that asked for no GPU."""
        run = _run_of(context)
        return run_allocation.read_allocation_tag(run.tags.get(rt.ALLOCATION))

    def checkpointed(self, context: RunOrContext, step: int | None = None, at: float | None = None) -> bool:
        """Report that the run of `context` (an op's or asset's context, or a run) saved a checkpoint
        at `at` (now by default; `step`: its epoch or step, for the log): the ledger records it on
        the run's allocation, so preempting the run from now on loses only the work after it (DESIGN.md
        section 5.2). A run that holds no allocation has nothing to record. Returns whether the
        ledger's time moved."""
        run = _run_of(context)
        at = time.time() if at is None else at
        moved = bool(run.tags.get(rt.ALLOCATION)) and bool(self.ledger().checkpointed_many({run.run_id: at}))
        if not isinstance(context, DagsterRun):  # debug: a loop that checkpoints every epoch would fill the run's log
            where = f" at step {step}" if step is not None else ""
            context.log.debug(f"checkpoint saved{where}: a preemption from now on loses only the work after it")
        return moved

    @contextmanager
    def on_preemption(self, context: StepContext) -> Iterator[None]:
        """Within this block the run's termination is its preemption notice, not a stop mid-step.

        The tick terminates a victim through Dagster (locally the run process gets Dagster's interrupt,
        SIGINT, from the launcher's terminate path; on Kubernetes the pod gets SIGTERM) and kills it
        when the grace ends. Here either signal only marks the notice: the loop inside asks
        `preemption_requested`, saves a checkpoint and calls `stop_on_notice`. Outside the block (or
        off the main thread, where no handler can be set) Dagster's own handling stands."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        taken = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.getsignal(sig) for sig in taken}

        state = _notice_state(context)

        def take_notice(_signo: int, _frame: Any) -> None:
            if state.signalled_at is None:
                state.signalled_at = time.time()

        for sig in taken:
            signal.signal(sig, take_notice)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def preemption_requested(self, context: StepContext) -> bool:
        """Whether this run got its preemption notice: the termination arrived inside `on_preemption`,
        or the tick's `xirang/notice` tag is on the run (read at most once a second)."""
        if _notice_state(context).signalled_at is not None:
            return True
        return self.notice(context) is not None

    def notice(self, context: StepContext, *, fresh: bool = False) -> Notice | None:
        """The notice the tick wrote on this run (who preempts it, the grace), or None; the run's tags
        are read at most once a second unless `fresh`."""
        state = _notice_state(context)
        now = time.monotonic()
        if state.notice is None and (fresh or now - state.read_at >= NOTICE_POLL_S):
            state.read_at = now
            run = context.instance.get_run_by_id(context.run.run_id)
            state.notice = read_notice(run.tags) if run is not None else None
        return state.notice

    def pause(self, context: StepContext, seconds: float) -> None:
        """Sleep `seconds`, cut short by a preemption notice."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.preemption_requested(context):
            time.sleep(min(NOTICE_SLEEP_S, max(0.0, end - time.monotonic())))

    def stop_on_notice(self, context: StepContext, step: int | None = None, *, saved: bool = True) -> None:
        """Stop the run cleanly after the checkpoint of `step` was saved on its notice (`saved=False`:
        the notice came before the loop's first step, so there was nothing to save): the run's log
        says what was saved and how much of the grace it used; raises Dagster's interruption, so the
        run ends cancelled as Dagster's termination ends it."""
        notice = self.notice(context, fresh=True)
        now = time.time()
        sent = notice.at if notice is not None else _notice_state(context).signalled_at or now
        grace = f" of the grace of {notice.grace_s:g} s" if notice is not None else ""
        where = f"the checkpoint of step {step}" if step is not None else "a checkpoint"
        done = f"{where} saved" if saved else NOTHING_TO_SAVE
        context.log.info(
            f"preemption notice taken: {done}, stopping {max(0.0, now - sent):.1f} s after the notice"
            f"{grace}; the resumption continues from {'it' if saved else 'where this run began'}"
        )
        raise DagsterExecutionInterruptedError(f"stopped on its preemption notice ({done})")

    def pool_state(self, instance: DagsterInstance | None = None) -> PoolState:
        """Allocated GPUs per tier, borrowed and idle GPUs, and (given an instance) the gated queue."""
        queued = instance.get_runs_count(held_filter()) if instance is not None else 0
        return pool_state(self.pool(), self.ledger().allocations(), queued)

    @contextmanager
    def yield_for_execution(self, context: InitResourceContext) -> Iterator[GpuPoolResource]:
        """In a run worker: refuse platform settings from run config, give the process the
        environment of its allocation (none: no GPU) while the run executes, and put the previous
        values back afterwards."""
        run = context.dagster_run
        if run is not None:
            refuse_platform_settings(run, _resource_key(context))
            self._in_run = True
        env = run_environment(run)
        previous = apply_environment(env, os.environ)  # type: ignore[arg-type]
        try:
            yield self
        finally:
            for key in env:
                if key in previous:
                    os.environ[key] = previous[key]
                else:
                    os.environ.pop(key, None)


class PlatformSettingsFromRunConfig(Exception):
    """A run's run config sets the pool resource's platform settings."""


def refuse_platform_settings(run: DagsterRun, key: str) -> None:
    """Raise when `run`'s run config sets a platform field of the resource under `key` (the
    coordinator refuses such a run at submission already; this holds for any resource key)."""
    problem = rt.platform_settings_problem(run.run_config, key)
    if problem is not None:
        raise PlatformSettingsFromRunConfig(problem.message)


def run_environment(run: DagsterRun | None) -> dict[str, str]:
    """The environment a run's process gets: its allocation's (`xirang/env`, written by the tick for
    the local launcher; none on Kubernetes, where the pod holds the devices), or, for a run that
    holds no allocation, no GPU at all."""
    if run is None:
        return {}
    if not run.tags.get(rt.ALLOCATION):
        return dict(NO_GPU_ENVIRONMENT)
    return json.loads(run.tags[rt.ENV]) if run.tags.get(rt.ENV) else {}


def _resource_key(context: InitResourceContext) -> str:
    """The key the resource is bound under (`gpu_pool` in the platform's Definitions)."""
    for key, definition in (context.all_resource_defs or {}).items():
        if definition is context.resource_def:
            return key
    return "gpu_pool"


NOTICE_POLL_S = 1.0  # how often a run reads its own tags for the notice
# `stop_on_notice` when the notice came before the loop's first step
NOTHING_TO_SAVE = "no step done since its last checkpoint or its start, nothing to save"
NOTICE_SLEEP_S = 0.05


@dataclass
class _NoticeState:
    """What this process knows of one run's notice: when its termination arrived inside
    `on_preemption`, the notice tag once read, and when the tag was last read (monotonic)."""

    signalled_at: float | None = None
    notice: Notice | None = None
    read_at: float = -1e9


_NOTICES: dict[str, _NoticeState] = {}  # run id -> its notice, in this process


def _run_of(context: RunOrContext) -> DagsterRun:
    return context if isinstance(context, DagsterRun) else context.run


def _notice_state(context: StepContext) -> _NoticeState:
    return _NOTICES.setdefault(context.run.run_id, _NoticeState())


_SYNCED: set[tuple[str, str, int]] = set()  # (ledger URL, config file, its generation) whose accounts were synced


@lru_cache(maxsize=8)
def _ledger(url: str, policy: OvercommitPolicy) -> Ledger:
    return Ledger(url, policy=policy)
