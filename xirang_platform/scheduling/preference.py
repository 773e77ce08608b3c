"""GPU model preference per tier (DESIGN.md section 4): the GPU models placement tries first.

The platform config may order GPU models for a tier, as Kueue orders resource flavors (training on
H100/A100 first, inference on L40S/A10 first). Placement takes the first model in the order that
can host the request now and packs within it, by the tier's usual rule; models the order does not
list come after the listed ones, all alike (the usual rule decides among them). A request's own
`xirang/gpu-model` and compute-level tags narrow the nodes before the order is read. A tier without
an order, or whose order names no model of the pool, is placed exactly as before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from xirang_platform.scheduling.tiers import TIER_RULES, TIERS_IN_ORDER, Tier

TIER_KEYS: tuple[str, ...] = (*(rules.level for rules in TIERS_IN_ORDER), *(t.value for t in Tier))
"""What an order may be given for: a level of the tier table, or a `xirang/tier` tag value."""


@dataclass(frozen=True)
class GpuModelOrder:
    """Per tier, the GPU models placement tries first, in order (see the module docstring).

    `by_tier` holds (tier, models) pairs, sorted by tier; a tier is a level of the tier table (`P0`,
    `P1`, `P2`) or a `xirang/tier` tag value (`batch-inference`, ...), whose entry replaces its
    level's entry for requests of that tag value. Empty: no preference anywhere.
    """

    by_tier: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for tier, models in self.by_tier:
            if tier not in TIER_KEYS:
                raise ValueError(f"GPU model order for unknown tier {tier!r}; use one of {', '.join(TIER_KEYS)}")
            if tier in seen:
                raise ValueError(f"GPU model order for {tier} is given twice; give each tier one list")
            seen.add(tier)
            if not models or not all(isinstance(m, str) and m for m in models):
                raise ValueError(f"GPU model order for {tier} must be a non-empty list of GPU model names")
            twice = sorted({m for m in models if models.count(m) > 1})
            if twice:
                raise ValueError(f"GPU model order for {tier} names {', '.join(twice)} twice; list each model once")

    @classmethod
    def of(cls, orders: Mapping[str, Sequence[str]]) -> GpuModelOrder:
        """The order of a mapping tier -> models (e.g. `{"P1": ["H100-SXM", "A100-80"]}`)."""
        return cls(tuple(sorted((str(tier), tuple(models)) for tier, models in orders.items())))

    def models_for(self, tier: Tier) -> tuple[str, ...]:
        """The models requests of `tier` try first, in order (empty: no preference)."""
        orders = dict(self.by_tier)
        return orders.get(tier.value) or orders.get(TIER_RULES[tier].level, ())


def first_in_order(candidates: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The `candidates` (a mask) whose model comes first in the order among them (`ranks`: per
    candidate, as `model_ranks` gives per node): the one place the order is applied."""
    if not candidates.any():
        return candidates
    return candidates & (ranks == ranks[candidates].min())
