"""Node scorers and their one registry: which feasible node, and which GPUs on it, a single-node
request takes. The cycle, the simulator's replay CLI and its fill mode all build scorers here.

Registered policies (`make_scorer(name, requests, seed, fill=...)`):
- `bestfit`: the fullest node (least GPU, then CPU, left), fullest GPUs; in fill mode FGD's
  repository score (integer, GPU and CPU weighted 1:1 against 8 GPUs / 128 cores).
- `fgd`: fragmentation gradient descent, faithful to FGD's repository, against the typical
  workload of `requests`.
- `xirang`: our policy, fragmentation-aware with best-fit tie-breaks (`Xirang`), against the
  typical workload of `requests`; without requests, against the workload each cycle sees
  (`CycleFittedXirang`).
- `random`: a uniform feasible node, seeded with `seed`, for baselines.

`DEFAULT_PLACEMENT` (`xirang`) is the policy the cycle, the simulator and every caller of `cycle`
use unless told otherwise; `bestfit` and `fgd` stay selectable as baselines. Without a workload
(`requests` empty, e.g. the live tick) it learns one per cycle from the requests the cycle sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.scorers.base import NodeLocalScorer, NodeScorer, is_node_local
from xirang_platform.scheduling.scorers.bestfit import BestFit
from xirang_platform.scheduling.scorers.cycle_fitted import CycleFittedXirang
from xirang_platform.scheduling.scorers.fgd import FGD
from xirang_platform.scheduling.scorers.fragmentation import TypicalWorkload
from xirang_platform.scheduling.scorers.randomfit import RandomFit
from xirang_platform.scheduling.scorers.xirang import TYPICAL_COVERAGE, Xirang

__all__ = [
    "DEFAULT_PLACEMENT",
    "FGD",
    "CycleFittedXirang",
    "NodeLocalScorer",
    "SCORERS",
    "BestFit",
    "NodeScorer",
    "RandomFit",
    "ScorerSpec",
    "Xirang",
    "default_scorer",
    "is_node_local",
    "make_scorer",
]

DEFAULT_PLACEMENT = "xirang"


@dataclass(frozen=True)
class ScorerSpec:
    """A registered placement policy: `build(requests, seed, fill, options)` returns its scorer."""

    name: str
    build: Callable[[Sequence[Request], int, bool, dict[str, Any]], NodeScorer]


def _workload(requests: Sequence[Request], coverage: float = 0.95) -> TypicalWorkload | None:
    return TypicalWorkload.from_requests(requests, coverage) if requests else None


SCORERS: dict[str, ScorerSpec] = {
    spec.name: spec
    for spec in (
        ScorerSpec("bestfit", lambda reqs, seed, fill, opts: BestFit(**{"integer_score": fill, **opts})),
        ScorerSpec("fgd", lambda reqs, seed, fill, opts: FGD(_workload(reqs), **opts)),
        ScorerSpec(
            "xirang",
            lambda reqs, seed, fill, opts: (
                Xirang(_workload(reqs, TYPICAL_COVERAGE), **opts) if reqs else CycleFittedXirang(**opts)
            ),
        ),
        ScorerSpec("random", lambda reqs, seed, fill, opts: RandomFit(seed, **opts)),
    )
}


def make_scorer(
    name: str, requests: Sequence[Request] = (), seed: int = 0, *, fill: bool = False, **options: Any
) -> NodeScorer:
    """The scorer registered as `name`: fragmentation scorers measure against the typical workload
    of `requests` (a generic one when empty), `random` draws with `seed`, `fill=True` configures it
    as FGD's fill experiments do; `options` go to the scorer's constructor."""
    spec = SCORERS.get(name)
    if spec is None:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {', '.join(sorted(SCORERS))}")
    return spec.build(requests, seed, fill, dict(options))


def default_scorer() -> NodeScorer:
    """The default placement policy (`DEFAULT_PLACEMENT`) with no known workload: learned per cycle."""
    return make_scorer(DEFAULT_PLACEMENT)
