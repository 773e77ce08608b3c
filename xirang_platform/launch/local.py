"""The local launcher: an allocation becomes the environment of the run's process.

No Dagster here. On one machine (the embedded default, a laptop or a single GPU server) the run
worker is a local process; what it may use is said through its environment: `CUDA_VISIBLE_DEVICES`
lists the GPU indices it holds on its node (CUDA renumbers them from 0 inside the process), and
`XIRANG_ALLOCATION` carries the whole placement as JSON for code that wants it (the node, each
GPU's milli and GPU memory, CPU and memory). A fraction of a GPU shows the GPU it shares; the
share itself is the scheduler's accounting (nothing on a plain local machine enforces it).

`LocalLauncher` is the `Launcher` (`xirang_platform.launch.launcher`) of launcher `local`: the
environment rides on the run as its `xirang/env` tag, a victim past its grace gets SIGKILL, and
what the Kubernetes launcher does with cluster objects (create, delete, pin) is nothing here.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping

from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
XIRANG_ALLOCATION = "XIRANG_ALLOCATION"
XIRANG_NODE = "XIRANG_NODE"
XIRANG_GPU_MILLI = "XIRANG_GPU_MILLI"

# What a local process the platform gave no GPU sees: none. The embedded default's code servers start
# with it (so every run process they spawn inherits it, a job without `gpu_pool` too), and
# `GpuPoolResource` sets an admitted run's own devices over it.
NO_GPU_ENVIRONMENT = {CUDA_VISIBLE_DEVICES: ""}


def local_environment(allocation: Allocation) -> dict[str, str]:
    """The environment variables that give a local process exactly the GPUs of `allocation`.

    A gang spanning several nodes cannot run as one local process: the variables name the first
    node's GPUs, and `XIRANG_ALLOCATION` lists every node so a multi-node launcher can fan out.
    """
    placement = allocation.placement
    first = placement.slices[0].node if placement.slices else (placement.shares[0].node if placement.shares else "")
    on_first = sorted({s.gpu for s in placement.slices if s.node == first})
    doc = {
        "request": allocation.id,
        "nodes": [
            {
                "node": share.node,
                "gpus": sorted({s.gpu for s in placement.slices if s.node == share.node}),
                "cpu_milli": share.cpu_milli,
                "memory_mib": share.memory_mib,
            }
            for share in placement.shares
        ],
        "slices": [
            {"node": s.node, "gpu": s.gpu, "milli": s.milli, "gpu_memory_mib": s.gpu_memory_mib}
            for s in placement.slices
        ],
        "borrowed": allocation.borrowed,
    }
    return {
        CUDA_VISIBLE_DEVICES: ",".join(str(g) for g in on_first),
        XIRANG_NODE: first,
        XIRANG_GPU_MILLI: str(placement.milli),
        XIRANG_ALLOCATION: json.dumps(doc, sort_keys=True, separators=(",", ":")),
    }


def apply_environment(env: Mapping[str, str], target: dict[str, str]) -> dict[str, str]:
    """Set `env` in `target` (e.g. `os.environ` of the run worker); returns the values replaced."""
    previous = {k: target[k] for k in env if k in target}
    target.update(env)
    return previous


def sigkill(pid: int) -> str | None:
    """SIGKILL to process `pid` on this host; what was done, or None when it was gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return None
    return f"SIGKILL to process {pid}"


class LocalLauncher:
    """Launcher `local`: run processes on this host, given their GPUs through the environment."""

    name = "local"

    def with_grace(self, seconds: float) -> LocalLauncher:
        """This launcher: a local process's grace is the notice's deadline, nothing to render."""
        return self

    def launch_tags(self, allocation: Allocation, pool: Pool) -> dict[str, str]:
        """`xirang/allocation` and `xirang/env` (`local_environment`, read by `GpuPoolResource`)."""
        return {
            rt.ALLOCATION: run_allocation.allocation_tag(allocation, allocation.borrowed, self.name),
            rt.ENV: json.dumps(local_environment(allocation), sort_keys=True),
        }

    def launch(self, allocation: Allocation, pool: Pool) -> str | None:
        """Nothing to create before the gate opens: never refused."""
        return None

    def stop(self, allocation: Allocation, pool: Pool) -> str | None:
        """Nothing to delete: the run process ends with its run."""
        return None

    def pin_gated_pods(self) -> dict[str, str] | str:
        """No pods to pin."""
        return {}

    def kill(self, run_id: str, pid: int | None) -> str | None:
        """SIGKILL to the run's process `pid` on this host; None without one (nothing else to kill)."""
        return None if pid is None else sigkill(pid)
