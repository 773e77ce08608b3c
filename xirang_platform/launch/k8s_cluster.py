"""The Kubernetes launcher (launcher `k8s`): the `Launcher` (`xirang_platform.launch.launcher`) the
scheduling tick and the release sensors call on a cluster.

One `K8sCluster` per process: the `K8sSubmitter` (`xirang_platform.launch.k8s_submit`) on the API
`K8sSubmitter.from_cluster` connects to (in-cluster, else the kubeconfig), and the operator's
`K8sSettings` (`$XIRANG_K8S_SETTINGS`, else the defaults). No Dagster here, and the `kubernetes`
client is imported inside the methods only, so a platform on the local launcher never imports or
configures it. Tests inject one on a recording fake API (`xirang_platform.launch.launcher.use_cluster`):

```python
with use_cluster(K8sCluster(K8sSubmitter("xirang", api, api, api, api, api), K8sSettings())):
    run_tick(instance, gpu_pool)
```

Outcomes as data: `launch` and `stop` return the cluster's refusal as a message (None when it
went through), so one refused allocation never stops the tick for the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from xirang_platform.control import run_allocation
from xirang_platform.control import run_tags as rt
from xirang_platform.launch.local import sigkill
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

_logger = logging.getLogger("xirang.k8s")


@dataclass(frozen=True)
class K8sCluster:
    """A `K8sSubmitter` and the `K8sSettings` every object it creates is rendered with."""

    submitter: Any  # xirang_platform.launch.k8s_submit.K8sSubmitter (kept lazy: see the module docstring)
    settings: Any  # xirang_platform.launch.k8s_settings.K8sSettings
    name = "k8s"

    def launch_tags(self, allocation: Allocation, pool: Pool) -> dict[str, str]:
        """`xirang/allocation` and the `dagster-k8s/config` tag (`k8s_config`)."""
        return {
            rt.ALLOCATION: run_allocation.allocation_tag(allocation, allocation.borrowed, self.name),
            rt.K8S_CONFIG: self.k8s_config(allocation, pool),
        }

    def launch(self, allocation: Allocation, pool: Pool) -> str | None:
        """Create what the admitted allocation needs before its gate opens (DRA claim template; a
        gang's headless Service and Indexed Job); the refusal's message, or None when created.

        A partly created launch (the Service created, the Job refused) is deleted again."""
        from xirang_platform.launch.k8s_gpu import LaunchError
        from xirang_platform.launch.k8s_submit import LaunchRefused

        try:
            self.submitter.launch(allocation, pool, self.settings)
        except (LaunchRefused, LaunchError) as exc:
            cleanup = self.stop(allocation, pool)
            return str(exc) if cleanup is None else f"{exc} (and its cleanup failed: {cleanup})"
        return None

    def stop(self, allocation: Allocation, pool: Pool) -> str | None:
        """Delete what `launch` created for the allocation (objects already gone count as deleted);
        the refusal's message, or None."""
        from xirang_platform.launch.k8s_gpu import LaunchError
        from xirang_platform.launch.k8s_submit import LaunchRefused

        try:
            self.submitter.stop(allocation, pool, self.settings)
        except (LaunchRefused, LaunchError) as exc:
            _logger.warning("deleting the objects of allocation %s failed: %s", allocation.id, exc)
            return str(exc)
        return None

    def pin_gated_pods(self) -> dict[str, str] | str:
        """Pin the gated gang and service pods to their nodes (`K8sSubmitter.pin_gated_pods`): pod ->
        node, or the refusal's message."""
        from xirang_platform.launch.k8s_submit import LaunchRefused

        try:
            pinned: dict[str, str] = self.submitter.pin_gated_pods()
        except LaunchRefused as exc:
            _logger.warning("pinning gated pods failed: %s", exc)
            return str(exc)
        return pinned

    def kill_run(self, run_id: str) -> list[str] | str:
        """Delete the pods of run `run_id` with no further grace (`K8sSubmitter.kill_run_pods`): the
        pod names deleted, or the refusal's message."""
        from xirang_platform.launch.k8s_submit import LaunchRefused

        try:
            killed: list[str] = self.submitter.kill_run_pods(run_id)
        except LaunchRefused as exc:
            _logger.warning("killing the pods of run %s failed: %s", run_id, exc)
            return str(exc)
        return killed

    def kill(self, run_id: str, pid: int | None) -> str | None:
        """At the end of its grace: SIGKILL to the run's process `pid` when it runs on this host, else
        its pods deleted with no further grace (`kill_run`); what was done, or None when nothing was
        left (or the cluster refused: logged, the next tick tries again)."""
        if pid is not None:
            return sigkill(pid)
        killed = self.kill_run(run_id)
        if isinstance(killed, str):
            return None
        return f"pods {', '.join(killed)} deleted with no further grace" if killed else None

    def with_grace(self, seconds: float) -> K8sCluster:
        """This cluster rendering every run pod with `seconds` of termination grace (the platform
        config's longest preemption grace, `PreemptionGrace.longest`)."""
        return replace(self, settings=replace(self.settings, termination_grace_s=seconds))

    def k8s_config(self, allocation: Allocation, pool: Pool) -> str:
        """The run's `dagster-k8s/config` tag, rendered with the same settings as its objects."""
        from xirang_platform.launch.k8s import dagster_k8s_config

        return dagster_k8s_config(allocation, pool, self.settings)


class K8sUnavailable(RuntimeError):
    """No cluster to launch on: the settings file is malformed or there is no cluster configuration
    (the message names the fix)."""


def connect_cluster() -> K8sCluster:
    """The cluster of a deployment: `$XIRANG_K8S_SETTINGS` (else the defaults) and the API the pod's
    service account (else the kubeconfig) reaches. Raises `K8sUnavailable`."""
    from xirang_platform.launch.k8s_settings import K8sSettingsError, settings_from_env
    from xirang_platform.launch.k8s_submit import K8sSubmitter, LaunchRefused

    try:
        settings = settings_from_env()
        return K8sCluster(K8sSubmitter.from_cluster(settings), settings)
    except (K8sSettingsError, LaunchRefused) as exc:
        raise K8sUnavailable(f"launcher k8s: {exc}") from None
