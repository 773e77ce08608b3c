"""What a preemption costs (DESIGN.md section 5.2): the work a victim loses (`work_lost`), the
contract's victim order (`victim_cost`: borrowed before in-quota, then least work lost, then fewest
victims; ids only break exact ties), and a plan (`Plan`: the victims and where the request runs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.model import Allocation, Placement, PreemptReason

Parts = tuple[int, int, int, int]  # a set's cost without the tie-break: in-quota lost, in-quota victims, lost, victims
VictimCost = tuple[int, int, int, int, tuple[tuple[Parts, str], ...]]
NOTHING: Parts = (0, 0, 0, 0)
NEVER: Parts = (1 << 62, 0, 0, 0)  # a bound no set reaches


@dataclass(frozen=True)
class Plan:
    """Victims to stop (with why) and where the request then runs."""

    victims: tuple[tuple[Allocation, PreemptReason], ...]
    placement: Placement


def work_lost(a: Allocation, now: float, checkpoint_interval_s: float | None) -> float:
    """GPU-seconds that preempting `a` at `now` throws away: the work since its last checkpoint, the
    later of the one it reported (`a.checkpointed_at`) and the last periodic one every
    `checkpoint_interval_s` from its start; since its start when it has neither."""
    ran = max(0.0, now - a.start)
    saved = math.floor(ran / checkpoint_interval_s) * checkpoint_interval_s if checkpoint_interval_s else 0.0
    if a.checkpointed_at is not None:
        saved = max(saved, min(ran, a.checkpointed_at - a.start))
    return (ran - saved) * a.milli / MILLI_PER_GPU


def victim_parts(a: Allocation, now: float, checkpoint_interval_s: float | None) -> Parts:
    """The cost of preempting `a` alone, without its id; work in micro-GPU-seconds (integers, so the
    sums over a set are exact)."""
    lost = round(work_lost(a, now, checkpoint_interval_s) * 1e6)
    return (0, 0, lost, 1) if a.borrowed else (lost, 1, lost, 1)


def victim_cost(victims: Iterable[Allocation], now: float, checkpoint_interval_s: float | None) -> VictimCost:
    """The cost of preempting `victims` (one, or a whole plan); smaller is cheaper.

    In order: in-quota work lost and in-quota victims (so borrowed victims always go first), then
    all work lost, then the number of victims; exact ties only: the victims cheapest first (each
    alone, id among equals), compared in turn.
    """
    each = sorted((victim_parts(v, now, checkpoint_interval_s), v.id) for v in victims)
    return (*total(parts for parts, _ in each), tuple(each))


def total(parts: Iterable[Parts]) -> Parts:
    """The sum of costs, part by part."""
    q = qn = lost = n = 0
    for a, b, c, d in parts:
        q, qn, lost, n = q + a, qn + b, lost + c, n + d
    return (q, qn, lost, n)


def plus(a: Parts, b: Parts) -> Parts:
    """The sum of two costs, part by part."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def minus(a: Parts, b: Parts) -> Parts:
    """`a` less `b`, part by part."""
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])
