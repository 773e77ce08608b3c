"""A service's live replicas sorted for a rollout: which serve the deployed version, which are ready.

A replica run is *ready* when the serving registry lists it (it registers once it listens, and
deregisters first thing when it drains) and its `/ready` answers 200; it serves the version the
registry names, or, not registered yet, the version it was asked for with (its run tag). The result
is the core's `Fleet` (`scheduling/rollout.py`). No Dagster here.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xirang_platform.scheduling.rollout import Fleet
from xirang_platform.serving.registry import Endpoint


@dataclass(frozen=True)
class LiveReplica:
    """One live replica run: its id, whether it still waits for units, the version it was asked for."""

    run_id: str
    waiting: bool
    asked_version: str


def answers_ready(endpoint: Endpoint, timeout_s: float = 1.0) -> bool:
    """Whether the replica's `/ready` answers 200 now."""
    try:
        with urllib.request.urlopen(f"{endpoint.url}/ready", timeout=timeout_s) as response:  # noqa: S310
            return bool(response.status == 200)
    except (urllib.error.URLError, TimeoutError, OSError):
        return False


def sort_fleet(
    replicas: Sequence[LiveReplica],
    registered: Sequence[Endpoint],
    deployed_version: str,
    ready: Callable[[Endpoint], bool] = answers_ready,
) -> Fleet:
    """The replicas (in the order they were asked for) as old/new and ready/waiting for `deployed_version`."""
    by_run = {e.run_id: e for e in registered}
    groups: dict[tuple[bool, bool], list[str]] = {(n, r): [] for n in (False, True) for r in (False, True)}
    for replica in replicas:
        endpoint = by_run.get(replica.run_id)
        version = endpoint.model_version if endpoint is not None else replica.asked_version
        is_ready = endpoint is not None and not replica.waiting and ready(endpoint)
        groups[(version == deployed_version, is_ready)].append(replica.run_id)
    return Fleet(groups[(False, True)], groups[(False, False)], groups[(True, True)], groups[(True, False)])
