"""The launcher: what turns an admitted allocation into a running run, behind one interface.

No Dagster here. The scheduling tick and the release sensors call a `Launcher` and never ask which
one it is: `LocalLauncher` (`xirang_platform.launch.local`: processes on this host, their GPUs in
the environment) or `K8sCluster` (`xirang_platform.launch.k8s_cluster`: pods, with the objects
created before the gate opens and deleted on release). `platform_launcher` picks it from the
platform config's `launcher` name, the one place the name is read.

The Kubernetes launcher is built on first use and kept for the process (it holds the API client);
the `kubernetes` client is imported only then, so a platform on the local launcher never imports
it. Tests inject one on a recording fake API with `use_cluster`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

from xirang_platform.control.platform_config import LAUNCHERS
from xirang_platform.launch.k8s_cluster import K8sCluster, connect_cluster
from xirang_platform.launch.local import LocalLauncher
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation


class Launcher(Protocol):
    """What the tick and the release sensors need of a launcher. Refusals come back as messages
    (None when it went through), so one refused allocation never stops the tick for the others."""

    @property
    def name(self) -> str:
        """The platform config's launcher name (written in `xirang/allocation`)."""
        ...

    def with_grace(self, seconds: float) -> Launcher:
        """This launcher giving every run `seconds` of termination grace (the longest preemption grace)."""
        ...

    def launch_tags(self, allocation: Allocation, pool: Pool) -> dict[str, str]:
        """The tags that carry an allocation to the launcher: `xirang/allocation` always, then
        `xirang/env` (local processes) or `dagster-k8s/config` (Kubernetes)."""
        ...

    def launch(self, allocation: Allocation, pool: Pool) -> str | None:
        """Create what the admitted allocation needs before its gate opens; the refusal's message."""
        ...

    def stop(self, allocation: Allocation, pool: Pool) -> str | None:
        """Delete what `launch` created for the allocation; the refusal's message."""
        ...

    def pin_gated_pods(self) -> dict[str, str] | str:
        """Pin the gated pods to their nodes: pod -> node, or the refusal's message."""
        ...

    def kill(self, run_id: str, pid: int | None) -> str | None:
        """Kill run `run_id` at the end of its grace (`pid`: its live process on this host, if it
        has one); what was done, or None when nothing was left to kill."""
        ...


_cluster: K8sCluster | None = None


def platform_launcher(name: str) -> Launcher:
    """The launcher the platform config names (`local` or `k8s`). The Kubernetes one is built on
    first use and kept; raises `K8sUnavailable` while it cannot be built, `ValueError` for a name
    that is not known (the platform config rejects one when it is read)."""
    global _cluster
    if name == "local":
        return LocalLauncher()
    if name == "k8s":
        if _cluster is None:
            _cluster = connect_cluster()
        return _cluster
    raise ValueError(f"launcher {name!r} is not known: use one of {', '.join(LAUNCHERS)}")


@contextlib.contextmanager
def use_cluster(cluster: K8sCluster) -> Iterator[K8sCluster]:
    """Within the block, launcher `k8s` is `cluster` (tests: a recording fake API)."""
    global _cluster
    previous = _cluster
    _cluster = cluster
    try:
        yield cluster
    finally:
        _cluster = previous
