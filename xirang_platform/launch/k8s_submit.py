"""Submission: create, patch and delete the rendered objects through the `kubernetes` client.

Thin on purpose: every object is built elsewhere (`k8s.py`, `k8s_gang.py`, `k8s_serve.py`); this
layer calls the API, retries a 409 (an object of the same name still being deleted, or a write
conflict), and turns the cluster's refusals into a `LaunchRefused` whose message names the cause
and the fix: RBAC (403), a ResourceQuota (403 "exceeded quota"), a missing PriorityClass, an
invalid object (422), a missing namespace (404).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from xirang_platform.launch.k8s import is_gang, run_objects
from xirang_platform.launch.k8s_gang import gang_objects, gang_pod_node
from xirang_platform.launch.k8s_pod import (
    ALLOCATION,
    DEFAULT_WORKLOAD,
    DEPLOYMENT,
    GANG,
    GATE,
    MANAGED_BY,
    SERVICE,
    Workload,
    label_value,
    pin_pod_patch,
)
from xirang_platform.launch.k8s_serve import (
    InferenceService,
    leaving_patch,
    replica_pin_patch,
    scale_patch,
    unbound_replicas,
)
from xirang_platform.launch.k8s_settings import K8sSettings
from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.model import Allocation

JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
RUN_ID_LABEL = "dagster/run-id"  # what dagster-k8s labels a run worker's Job and pod with
MANAGED_SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())


class LaunchRefused(RuntimeError):
    """The cluster refused (or could not be reached); `cause`: rbac, quota, priority-class, invalid,
    namespace, conflict, config or api."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True)
class _Kind:
    api: str  # attribute of the launcher holding the API object
    plural: str  # the method suffix: create_namespaced_<plural>, ...
    resource: str  # the resource name RBAC speaks of


_KINDS: Mapping[str, _Kind] = {
    "Job": _Kind("batch", "job", "jobs"),
    "Service": _Kind("core", "service", "services"),
    "Deployment": _Kind("apps", "deployment", "deployments"),
    "ResourceClaimTemplate": _Kind("resource", "resource_claim_template", "resourceclaimtemplates"),
    "Pod": _Kind("core", "pod", "pods"),
}


def _status(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def refusal(exc: ApiException, verb: str, kind: str, name: str, namespace: str) -> LaunchRefused:
    """A `LaunchRefused` naming why the API server refused `verb` on `kind/name`, and the fix."""
    status = _status(exc)
    message = str(status.get("message") or exc.reason or "").strip()
    what = f"{verb} {kind} {namespace}/{name}"
    resource = _KINDS[kind].resource if kind in _KINDS else kind.lower()
    if "no PriorityClass with name" in message:
        return LaunchRefused(
            "priority-class",
            f"{what}: {message}; apply deploy/priority-classes.yaml (one PriorityClass per tier) or set "
            "priority_classes in the launcher settings to classes the cluster has",
        )
    if exc.status == 403 and "exceeded quota" in message:
        return LaunchRefused(
            "quota",
            f"{what}: the namespace's ResourceQuota refuses it ({message}); raise the quota's GPU/CPU/memory "
            f"limits (kubectl describe resourcequota -n {namespace}) or lower what the tenant's quota admits",
        )
    if exc.status == 403:
        return LaunchRefused(
            "rbac",
            f"{what}: forbidden ({message}); the launcher's service account needs `{verb}` on {resource} in "
            f"{namespace}: apply deploy/rbac.yaml (Role xirang-launcher and its RoleBinding)",
        )
    if exc.status == 422:
        causes = status.get("details", {}).get("causes", []) if isinstance(status.get("details"), dict) else []
        fields = "; ".join(f"{c.get('field', '?')}: {c.get('message', '')}" for c in causes if isinstance(c, dict))
        return LaunchRefused(
            "invalid",
            f"{what}: the API server rejected the object ({fields or message}); it was rendered wrong or the "
            "cluster lacks an API it uses (DRA needs Kubernetes >= 1.34): fix the settings or report a bug",
        )
    if exc.status == 404 and "namespaces" in message:
        return LaunchRefused(
            "namespace",
            f"{what}: namespace {namespace} does not exist ({message}); kubectl apply -f deploy/namespace.yaml",
        )
    if exc.status == 409:
        return LaunchRefused(
            "conflict",
            f"{what}: {message or 'conflict'} and retries did not clear it; another object holds the name: "
            "delete it, or check that two launchers are not running",
        )
    return LaunchRefused("api", f"{what}: API error {exc.status} {exc.reason}: {message}")


def connect(kubeconfig: str | None = None, context: str | None = None) -> None:
    """Configure the client: in-cluster when neither is given and it runs in a pod, else the kubeconfig.

    Raises `LaunchRefused` (cause `config`) naming what to pass when there is no configuration.
    """
    from kubernetes import config

    try:
        if kubeconfig is None and context is None:
            try:
                config.load_incluster_config()
                return
            except config.ConfigException:
                pass
        config.load_kube_config(config_file=kubeconfig, context=context)
    except (config.ConfigException, OSError) as exc:
        raise LaunchRefused(
            "config", f"no cluster configuration ({exc}); pass --kubeconfig (and --context), or run inside the cluster"
        ) from None


def _meta(obj: Any) -> tuple[str, str]:
    return obj.kind, obj.metadata.name


def _labels_of(obj: Any) -> Mapping[str, str]:
    return (obj.metadata.labels or {}) if obj is not None and obj.metadata is not None else {}


class K8sSubmitter:
    """Creates, patches and deletes Xirang's objects in one namespace.

    `core`, `batch`, `apps`, `resource` and `scheduling` are `CoreV1Api`, `BatchV1Api`, `AppsV1Api`,
    `ResourceV1Api` and `SchedulingV1Api` objects (or anything with the same methods: tests pass a
    recording fake). A 409 is retried `retries` times, `backoff_s` apart (doubling).
    """

    def __init__(
        self,
        namespace: str,
        core: Any,
        batch: Any,
        apps: Any,
        resource: Any = None,
        scheduling: Any = None,
        retries: int = 4,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.namespace = namespace
        self.core, self.batch, self.apps, self.resource, self.scheduling = core, batch, apps, resource, scheduling
        self.retries, self.backoff_s, self.sleep = retries, backoff_s, sleep

    @classmethod
    def from_cluster(
        cls, settings: K8sSettings, kubeconfig: str | None = None, context: str | None = None
    ) -> K8sSubmitter:
        """A launcher on the real API (`connect`'s configuration)."""
        connect(kubeconfig, context)
        return cls(
            settings.namespace,
            client.CoreV1Api(),
            client.BatchV1Api(),
            client.AppsV1Api(),
            client.ResourceV1Api(),
            client.SchedulingV1Api(),
        )

    def _api(self, kind: str) -> tuple[Any, str]:
        spec = _KINDS[kind]
        return getattr(self, spec.api), spec.plural

    def _call(self, verb: str, kind: str, name: str, fn: Callable[[], Any]) -> Any:
        """`fn()`, retrying 409 conflicts; any other refusal becomes LaunchRefused."""
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except ApiException as exc:
                if exc.status != 409 or attempt == self.retries:
                    raise refusal(exc, verb, kind, name, self.namespace) from None
                self.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def create(self, obj: Any) -> Any:
        """Create `obj`; an object of the same name that belongs to the same allocation counts as created.

        An object of that name still being deleted (a preempted run's) is waited out through retries.
        """
        kind, name = _meta(obj)
        api, plural = self._api(kind)
        create = getattr(api, f"create_namespaced_{plural}")
        read = getattr(api, f"read_namespaced_{plural}")

        def attempt() -> Any:
            try:
                return create(namespace=self.namespace, body=obj)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                try:
                    existing = read(name=name, namespace=self.namespace)
                except ApiException as gone:
                    if gone.status == 404:  # deleted in between: creating again is the retry
                        raise exc from None
                    raise
                same = _labels_of(existing).get(ALLOCATION) == _labels_of(obj).get(ALLOCATION)
                if same and existing.metadata.deletion_timestamp is None:
                    return existing
                raise

        return self._call("create", kind, name, attempt)

    def create_all(self, objects: Iterable[Any]) -> list[Any]:
        """Create each object in order (claim templates and Services before the Jobs that use them)."""
        return [self.create(o) for o in objects]

    def read(self, kind: str, name: str) -> Any:
        """The object `kind/name` as the cluster has it."""
        api, plural = self._api(kind)
        fn = getattr(api, f"read_namespaced_{plural}")
        return self._call("get", kind, name, lambda: fn(name=name, namespace=self.namespace))

    def patch(self, kind: str, name: str, body: Any) -> Any:
        """Patch `kind/name` (a dict is a strategic merge patch, a list a JSON patch), retrying conflicts."""
        api, plural = self._api(kind)
        fn = getattr(api, f"patch_namespaced_{plural}")
        # Named explicitly: for a dict body the client would pick its first type, JSON patch.
        content_type = JSON_PATCH if isinstance(body, list) else STRATEGIC_MERGE_PATCH
        return self._call(
            "patch", kind, name, lambda: fn(name=name, namespace=self.namespace, body=body, _content_type=content_type)
        )

    def delete(self, kind: str, name: str) -> bool:
        """Delete `kind/name` and its pods (foreground); False if it was already gone."""
        api, plural = self._api(kind)
        fn = getattr(api, f"delete_namespaced_{plural}")
        options = client.V1DeleteOptions(propagation_policy="Foreground")

        def attempt() -> bool:
            try:
                fn(name=name, namespace=self.namespace, body=options)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        return bool(self._call("delete", kind, name, attempt))

    def delete_all(self, objects: Sequence[Any]) -> list[bool]:
        """Delete the objects, last created first (on preemption: the gang's Job, Service, claim template)."""
        return [self.delete(*_meta(o)) for o in reversed(objects)]

    def check_priority_classes(self, settings: K8sSettings) -> None:
        """LaunchRefused naming each tier's PriorityClass the cluster lacks (pods would be refused later)."""
        missing = []
        for tier, name in sorted(settings.priority_classes.items()):
            try:
                self.scheduling.read_priority_class(name=name)
            except ApiException as exc:
                if exc.status != 404:
                    raise refusal(exc, "get", "PriorityClass", name, "(cluster)") from None
                missing.append(f"{name} ({tier.value})")
        if missing:
            raise LaunchRefused(
                "priority-class",
                f"PriorityClasses missing: {', '.join(missing)}; kubectl apply -f deploy/priority-classes.yaml",
            )

    def launch(
        self, allocation: Allocation, pool: Pool, settings: K8sSettings, workload: Workload = DEFAULT_WORKLOAD
    ) -> list[Any]:
        """Create what an admitted allocation needs besides its Dagster run worker, before the gate opens.

        DRA mode: the run worker's ResourceClaimTemplate. A gang: its headless Service and Indexed
        Job (and claim template), then its pods are pinned as they appear (`pin_gated_pods`).
        """
        objects = list(run_objects(allocation, pool, settings))
        if is_gang(allocation):
            objects += gang_objects(allocation, pool, settings, workload).objects()
        created = self.create_all(objects)
        if is_gang(allocation):
            self.pin_gated_pods()
        return created

    def stop(self, allocation: Allocation, pool: Pool, settings: K8sSettings) -> list[bool]:
        """Delete what `launch` created for an allocation (on preemption or release), pods included.

        The run worker's own Job is Dagster's to delete (`K8sRunLauncher.terminate`).
        """
        objects = list(run_objects(allocation, pool, settings))
        if is_gang(allocation):
            objects += gang_objects(allocation, pool, settings).objects()
        return self.delete_all(objects)

    def kill_run_pods(self, run_id: str) -> list[str]:
        """Delete, with no further grace, the pods of run `run_id`: its Dagster run worker's (label
        `dagster/run-id`) and its gang's (label `xirang.io/allocation`); the names deleted. For a
        victim whose preemption grace ended: the pods' own `terminationGracePeriodSeconds` is the
        longest grace of any tier, and a shorter one (a P0's) ends here."""
        selectors = [f"{RUN_ID_LABEL}={run_id}", ",".join([MANAGED_SELECTOR, f"{ALLOCATION}={label_value(run_id)}"])]
        names = sorted({p.metadata.name for selector in selectors for p in self._pods(selector)})
        options = client.V1DeleteOptions(grace_period_seconds=0)
        killed = []
        for name in names:

            def attempt(name: str = name) -> bool:
                try:
                    self.core.delete_namespaced_pod(name=name, namespace=self.namespace, body=options)
                except ApiException as exc:
                    if exc.status == 404:
                        return False
                    raise
                return True

            if self._call("delete", "Pod", name, attempt):
                killed.append(name)
        return killed

    def _pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(namespace=self.namespace, label_selector=selector).items)

    def pin_gated_pods(self) -> dict[str, str]:
        """Pin every gated Xirang pod of the namespace to its node and lift its gate; returns pod -> node.

        A gang pod's node is the one its completion index names in `xirang.io/pod-nodes`; a service's
        pod is bound to a replica its Deployment's `xirang.io/replicas` names that no other pod holds.
        Idempotent: call it after creating a gang or scaling a service, and from the reconcile loop
        (a Deployment or Job creates its pods a moment after the API call).
        """
        pods = self._pods(MANAGED_SELECTOR)
        gated = sorted((p for p in pods if _is_gated(p)), key=lambda p: p.metadata.name)
        pinned: dict[str, str] = {}
        waiting: dict[str, list[Any]] = {}
        for pod in gated:
            labels, notes = _labels_of(pod), pod.metadata.annotations or {}
            if GANG in labels:
                node = gang_pod_node(labels, notes)
                if node is not None:
                    self.patch("Pod", pod.metadata.name, pin_pod_patch(node, {}, {}, has_affinity=True))
                    pinned[pod.metadata.name] = node
            elif DEPLOYMENT in notes:
                waiting.setdefault(notes[DEPLOYMENT], []).append(pod)
        for name, queue in sorted(waiting.items()):
            deployment = self.read("Deployment", name)
            bound = [
                (p.metadata.annotations or {}).get(ALLOCATION, "")
                for p in pods
                if not _is_gated(p) and (p.metadata.annotations or {}).get(DEPLOYMENT) == name
            ]
            free = unbound_replicas(deployment.metadata.annotations or {}, bound)
            for pod, (replica, node) in zip(queue, free, strict=False):
                self.patch("Pod", pod.metadata.name, replica_pin_patch(replica, node))
                pinned[pod.metadata.name] = node
        return pinned

    def scale(self, service: InferenceService, leaving: Sequence[str] = ()) -> dict[str, str]:
        """Set the Deployment to the service's replica allocations, then pin whatever pods wait.

        `leaving` names replica allocations being removed: their pods are marked to be deleted first.
        """
        if leaving:
            for pod in self._pods(f"{SERVICE}={label_value(service.name)}"):
                if (pod.metadata.annotations or {}).get(ALLOCATION) in set(leaving):
                    self.patch("Pod", pod.metadata.name, leaving_patch())
        self.patch("Deployment", service.object_name, scale_patch(service))
        return self.pin_gated_pods()


def _is_gated(pod: Any) -> bool:
    return any(g.name == GATE for g in (pod.spec.scheduling_gates or []))
