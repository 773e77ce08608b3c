"""Preemption notice and grace (DESIGN.md section 5.2, issue 23): what a victim is told, how long it
has, and when its preemptor may launch. No Dagster here: the tick (`sensors/notices.py`), the run's
`GpuPoolResource` and the Kubernetes renderer read the same rules.

- **Grace** per preemptor tier: the tier table's `preemption_grace_s` (P0 15 s, P1 and P2 120 s),
  overridden by the platform config's `preemption_grace_s: {P0: 15, P1: 120}` (a level of the tier
  table or a `xirang/tier` value; a tag value wins over its level). 0 stops the victim at once.
- **Notice** (`xirang/notice` on the victim): who preempts it, the grace and when it was sent. The
  victim's run is terminated through Dagster at once (its process gets the interrupt a training loop
  takes as the notice, `GpuPoolResource.on_preemption`) and killed when the grace ends.
- **Wait** (`xirang/after-notice` on the preemptor): the victims whose units it holds in the ledger
  and the end of their grace; its gate opens once every victim stopped, or the grace ended.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from xirang_platform.control import run_tags as rt
from xirang_platform.scheduling.model import Tier
from xirang_platform.scheduling.preference import TIER_KEYS
from xirang_platform.scheduling.tiers import TIERS_IN_ORDER

GRACE_EXAMPLE = "e.g. preemption_grace_s: {P0: 15, P1: 120}"


@dataclass(frozen=True)
class PreemptionGrace:
    """Seconds of grace a victim gets, per preemptor tier; `overrides`: (tier key, seconds) pairs of
    the platform config, sorted (a key is a tier level `P0`.. or a `xirang/tier` value)."""

    overrides: tuple[tuple[str, float], ...] = ()

    def for_tier(self, tier: Tier) -> float:
        """The grace a victim of a request of `tier` gets."""
        given = dict(self.overrides)
        return given.get(tier.value, given.get(tier.rules.level, tier.rules.preemption_grace_s))

    def longest(self) -> float:
        """The longest grace any preemptor gives (a Kubernetes pod's `terminationGracePeriodSeconds`)."""
        return max(self.for_tier(t) for t in Tier)


def parse_grace(doc: Any, where: str) -> PreemptionGrace:
    """The `preemption_grace_s` mapping of the platform config; ValueError naming the key and the fix."""
    if doc is None:
        return PreemptionGrace()
    if not isinstance(doc, Mapping):
        raise ValueError(f"{where}: expected a mapping of tier to seconds, {GRACE_EXAMPLE}")
    pairs = []
    for key, value in doc.items():
        if key not in TIER_KEYS:
            levels = ", ".join(TIER_KEYS)
            raise ValueError(f"{where}: unknown tier {key!r}; use a level or a tier of {levels}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ValueError(
                f"{where}.{key}: grace must be a number of seconds >= 0 (0 stops the victim at once), got {value!r}"
            )
        pairs.append((str(key), float(value)))
    return PreemptionGrace(tuple(sorted(pairs)))


def default_grace_table() -> dict[str, float]:
    """Level -> grace of the tier table, as the config's defaults read."""
    return {rules.level: rules.preemption_grace_s for rules in TIERS_IN_ORDER}


@dataclass(frozen=True)
class Notice:
    """A victim's notice: run `by` preempts it (`reason`), sent at `at`, with `grace_s` to stop."""

    by: str
    reason: str
    grace_s: float
    at: float

    @property
    def deadline(self) -> float:
        """When the victim is killed if it still runs."""
        return self.at + self.grace_s

    def tag(self) -> str:
        """The `xirang/notice` value."""
        return json.dumps(
            {"by": self.by, "reason": self.reason, "grace_s": self.grace_s, "at": self.at}, sort_keys=True
        )

    def message(self) -> str:
        """The notice as the victim's event log shows it."""
        return (
            f"preemption notice: run {self.by} needs these units ({self.reason}); save a checkpoint and stop "
            f"within the grace of {self.grace_s:g} s, or the run is killed"
        )


@dataclass(frozen=True)
class Wait:
    """A preemptor's wait: the `victims` (run ids) in their grace, which ends at `deadline`."""

    victims: tuple[str, ...]
    deadline: float

    def tag(self) -> str:
        """The `xirang/after-notice` value."""
        return json.dumps({"victims": list(self.victims), "deadline": self.deadline}, sort_keys=True)

    def over(self, stopped: Collection[str], now: float) -> bool:
        """Whether the preemptor may launch: every victim stopped, or the grace ended."""
        return now >= self.deadline or all(v in stopped for v in self.victims)


def read_notice(tags: Mapping[str, str]) -> Notice | None:
    """A run's notice (None: none, or a tag blanked or not the platform's)."""
    doc = _json(tags.get(rt.NOTICE))
    try:
        return Notice(str(doc["by"]), str(doc["reason"]), float(doc["grace_s"]), float(doc["at"])) if doc else None
    except (KeyError, TypeError, ValueError):
        return None


def read_wait(tags: Mapping[str, str]) -> Wait | None:
    """A preemptor's wait (None: it waits for nothing)."""
    doc = _json(tags.get(rt.AFTER_NOTICE))
    try:
        return Wait(tuple(str(v) for v in doc["victims"]), float(doc["deadline"])) if doc else None
    except (KeyError, TypeError, ValueError):
        return None


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
