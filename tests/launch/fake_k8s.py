"""A recording fake of the `kubernetes` client's API objects, the way dagster-k8s tests its launcher.

`RecordingApi` is one object standing in for `CoreV1Api`, `BatchV1Api`, `AppsV1Api`, `ResourceV1Api`
and `SchedulingV1Api`: every `create_/read_/patch_/delete_/list_` call is recorded as
`(method, kwargs)`; `script(method, *outcomes)` queues what the next calls return or raise (an
`ApiException` built with the API server's own Status body), else `create_*` stores and returns
the body, `read_*` returns what was stored, a dict `patch_*` merges into what was stored, `list_*`
returns the pods (those its equality label selector matches) and nodes handed in.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException


def api_error(status: int, reason: str, message: str, causes: list[dict[str, str]] | None = None) -> ApiException:
    """An ApiException carrying the `Status` body the API server sends with a refusal."""
    exc = ApiException(status=status, reason=reason)
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "code": status,
    }
    body["reason"] = reason.replace(" ", "")
    if causes:
        body["details"] = {"causes": causes}
    exc.body = json.dumps(body)
    return exc


class RecordingApi:
    """Records every API call; answers from a script, else from an in-memory store."""

    def __init__(self, pods: list[client.V1Pod] | None = None, nodes: list[client.V1Node] | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.store: dict[str, Any] = {}
        self.pods = pods or []
        self.nodes = nodes or []
        self._script: dict[str, deque] = defaultdict(deque)

    def script(self, method: str, *outcomes: Any) -> None:
        """Queue outcomes for `method`: an exception is raised, anything else returned."""
        self._script[method].extend(outcomes)

    def methods(self) -> list[str]:
        """The names of the calls made, in order."""
        return [m for m, _ in self.calls]

    def __getattr__(self, method: str) -> Any:
        if method.split("_", 1)[0] not in ("create", "read", "patch", "delete", "list"):
            raise AttributeError(method)

        def call(**kwargs: Any) -> Any:
            self.calls.append((method, kwargs))
            if self._script[method]:
                outcome = self._script[method].popleft()
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome
            return self._default(method, kwargs)

        return call

    def _default(self, method: str, kwargs: dict[str, Any]) -> Any:
        verb = method.split("_", 1)[0]
        if verb == "create":
            body = kwargs["body"]
            self.store[f"{body.kind}/{body.metadata.name}"] = body
            return body
        if method == "list_namespaced_pod":
            wanted = dict(term.split("=", 1) for term in (kwargs.get("label_selector") or "").split(",") if term)
            return client.V1PodList(items=[p for p in self.pods if wanted.items() <= (p.metadata.labels or {}).items()])
        if method == "list_node":
            return client.V1NodeList(items=self.nodes)
        if verb == "patch" and isinstance(kwargs["body"], dict):
            for key, obj in self.store.items():
                if key.endswith(f"/{kwargs['name']}"):
                    _merge(obj, kwargs["body"])
                    return obj
        if verb == "read":
            for key, obj in self.store.items():
                if key.endswith(f"/{kwargs['name']}"):
                    return obj
            raise api_error(404, "Not Found", f'"{kwargs["name"]}" not found')
        return client.V1Status(status="Success")


def _merge(obj: Any, patch: dict[str, Any]) -> None:
    """A merge patch (snake_case keys) applied to a kubernetes model, as the API server would."""
    for key, value in patch.items():
        current = getattr(obj, key)
        if isinstance(value, dict) and hasattr(current, "openapi_types"):
            _merge(current, value)
        elif isinstance(value, dict) and isinstance(current, dict):
            current.update(value)
        else:
            setattr(obj, key, value)


def pod_from(template: client.V1PodTemplateSpec, name: str, index: int | None = None) -> client.V1Pod:
    """A pod as its controller creates it from `template` (an Indexed Job adds the completion index)."""
    labels = dict(template.metadata.labels or {})
    annotations = dict(template.metadata.annotations or {})
    if index is not None:
        labels["batch.kubernetes.io/job-completion-index"] = str(index)
        annotations["batch.kubernetes.io/job-completion-index"] = str(index)
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels, annotations=annotations), spec=template.spec
    )
