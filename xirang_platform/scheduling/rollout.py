"""Rolling redeploys of an inference service, as a pure step: which replicas start and which stop.

When a new model version is deployed, the service's replicas serving an older version are replaced
replica by replica, as a Kubernetes Deployment's RollingUpdate does with maxSurge 1 and
maxUnavailable 0 (the service never has fewer ready replicas than its target, and never drops to
zero):
1. old replicas that are not ready yet (waiting for units, or starting) stop at once: they serve
   nothing, a new replica takes their place;
2. old ready replicas stop only while the ready ones (old and new) stay at least the target (and at
   least one): each new replica that became ready lets one old one go (and old ones past a target
   that fell go at once);
3. new replicas start up to the target, plus one surge replica while old ones remain (it is a P0
   request like any replica: at a full tenant cap it waits, and the old replicas keep serving).
A replica is *new* when it serves (or, not registered yet, was asked for with) the deployed version.
The step is called on every evaluation until no old replica remains; it reads no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Fleet:
    """A service's live replicas by version and readiness, each list in the order they were asked for."""

    old_ready: Sequence[str] = ()
    old_waiting: Sequence[str] = ()
    new_ready: Sequence[str] = ()
    new_waiting: Sequence[str] = ()

    @property
    def rolling(self) -> bool:
        """Whether a rollout is under way (some replica serves an older version)."""
        return bool(self.old_ready or self.old_waiting)

    @property
    def size(self) -> int:
        """Live replicas, old and new."""
        return len(self.old_ready) + len(self.old_waiting) + len(self.new_ready) + len(self.new_waiting)


@dataclass(frozen=True)
class RolloutStep:
    """What one evaluation does for the rollout: start `start` new replicas, stop the `stop` ones."""

    start: int
    stop: tuple[str, ...]
    done: bool


def rollout_step(fleet: Fleet, target: int) -> RolloutStep:
    """The next step of replacing `fleet`'s old replicas by new ones toward `target` replicas (rules
    in the module docstring)."""
    target = max(1, target)
    stop = list(fleet.old_waiting)  # 1.
    ready = len(fleet.old_ready) + len(fleet.new_ready)
    removable = max(0, ready - target)  # 2.
    stop += list(fleet.old_ready)[:removable]
    old_left = len(fleet.old_ready) - min(removable, len(fleet.old_ready))
    new = len(fleet.new_ready) + len(fleet.new_waiting)
    surge = 1 if old_left else 0
    start = max(0, min(target - new + surge, target + surge - (old_left + new)))  # 3.
    return RolloutStep(start, tuple(stop), done=old_left == 0 and not fleet.old_waiting)
