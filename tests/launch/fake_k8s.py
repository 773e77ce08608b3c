"""A recording fake of the `kubernetes` client's API objects, the way dagster-k8s tests its launcher.

`RecordingApi` is one object standing in for `CoreV1Api`, `BatchV1Api`, `AppsV1Api`, `ResourceV1Api`
and `SchedulingV1Api`: every `create_/read_/patch_/delete_/list_` call is recorded as
`(method, kwargs)`; `script(method, *outcomes)` queues what the next calls return or raise (an
`ApiException` built with the API server's own Status body), else `create_*` stores and returns
the body, `read_*` returns what was stored, `list_*` returns the pods/nodes handed in.
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
            return client.V1PodList(items=self.pods)
        if method == "list_node":
            return client.V1NodeList(items=self.nodes)
        if verb == "read":
            for key, obj in self.store.items():
                if key.endswith(f"/{kwargs['name']}"):
                    return obj
            raise api_error(404, "Not Found", f'"{kwargs["name"]}" not found')
        return client.V1Status(status="Success")
