"""How the scheduler behaves: `SchedulerConfig` and the defaults DESIGN.md gives (`DEFAULT_CONFIG`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from xirang_platform.scheduling.model import Request
from xirang_platform.scheduling.preference import GpuModelOrder
from xirang_platform.scheduling.quota import OvercommitPolicy
from xirang_platform.scheduling.scorers import CycleFittedXirang, NodeScorer, default_scorer
from xirang_platform.scheduling.tiers import TIERS_IN_ORDER, TierRules


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler behaves; every field has the default DESIGN.md gives.

    - `overcommit`: the cap ratio and how it falls with cluster allocation (section 6).
    - `min_runtime_s`: an allocation younger than this is never preempted (anti-thrash) by a request
      of a tier without its own entry in `min_runtime_by_level`.
    - `min_runtime_by_level`: (tier level, seconds) pairs that replace `min_runtime_s` for requests of
      that tier of the tier table (`min_runtime_for`). Default: P0 (inference, latency-critical) is
      not held back by it: the minimum runtime is there so training does not thrash training, and a
      replica waiting for a victim to age is inference latency. P0 preempts only within its own
      tenant's cap (it never borrows), and a reclaimed borrower waits out the reclaim back-off before
      it borrows again, so P0 cannot stop the same work over and over.
    - `starvation_wait_s`: after waiting this long, the oldest blocked gang gets units held back
      from backfill.
    - `reclaim_backoff_s`: a request whose borrowed run was reclaimed borrows again out of any idle
      units only this long after the reclaim, doubled for every earlier reclaim of it (`borrow_backoff_s`):
      a lender whose idle units come and go does not see the same borrower take them back each time,
      so reclaim does not thrash. Before that it still borrows out of capacity whose idleness has
      lasted `lend_after_s` (`quota.lasting_lendable` over `Snapshot.lasting_idle`) or is forecast to
      last (`lend_forecast_s`), so lending that is not churned is not withheld. In-quota admission and
      a first borrow are never delayed by it.
    - `lend_after_s`: how long a tenant's idle quota must have stayed idle to be lent to a reclaimed
      request before its back-off ends.
    - `lend_forecast_s`: the lending forecast, and how much of a lender's history it reads. A borrow
      takes free units only as far as they are not idle quota its owner is forecast to take back within
      `checkpoint_interval_s` (`quota.lendable_ahead` over `Snapshot.idle_ahead`, `lending.idle_views`):
      work lent there would be stopped before its first checkpoint and lose its whole run (with a
      preemption notice that fits a checkpoint it loses nothing, and the forecast then pays by the
      lend-then-reclaim churn it avoids: docs/design-notes.md, record A5). Each level
      of an owner's idle quota is forecast to stay idle as long as it did the last time, by the owner's
      in-quota history over this span (`quota.forecast_idle`); a level that has not been taken back
      within the span is lent as it comes. It applies to owners whose in-quota work preempts victims
      younger than a checkpoint interval (P0 by default; others take units back only from victims
      past their minimum runtime). Default 2 hours: a swing that recurs within the hour shows a whole
      earlier episode. None, or no checkpoint interval, turns the rule off.
    - `checkpoint_interval_s`: how often running work checkpoints; a victim loses the GPU-seconds
      since its last checkpoint (None: since its start). Victim choice minimises that loss.
    - `preemption`: False turns preemption off (FGD's fill method: a placed pod never moves).
    - `scorer`: the node scorer for P0 replicas and other single-node placements; default
      `scorers.default_scorer()`: Xirang's fragmentation-aware policy against the typical workload
      of the requests each cycle sees (`fitted`); callers that know their workload pass
      `make_scorer("xirang", requests)`.
    - `node_priority_seed`: None orders node ties by name; a seed draws a fixed random node order
      (FGD's simulator breaks ties that way).
    - `gpu_model_order`: per tier, the GPU models placement tries first, in order (`preference`):
      a request lands on the first of them that can host it now, packed there; unlisted models come
      after. Default: none (the placement benchmark's and the trace replays' placement).
    - `plan_steps_per_request`, `plan_steps_per_cycle`: the preemption planner's budget in steps (a
      candidate read, a victim set tried: `preemption.scope_search.Steps`; steps, not seconds, so a
      cycle decides the same on any machine). A request's search stops with the best plan found once
      it spent its steps; once the cycle's are spent, the requests that would plan a preemption are
      held `deferred` and go first in their tier next cycle (DESIGN.md 5.2, 5.6). How the defaults
      were chosen: docs/design-notes.md, record B9.
    - `elastic_grow_idle_s`: how long units must have stayed free before a running elastic run grows
      into them (DESIGN.md section 11; the caller measures it: `Snapshot.lasting_free`,
      `elastic.LastingFree`). Default 600 s: as long as the inference autoscaler's scale-down
      cooldown, so a unit freed by a passing dip in load is not grown into and shrunk back at once.
      None: elastic runs never grow (they still take the largest size that fits at admission).
    - `exhaustive_preemption`: True plans preemptions by trying every subset of every scope
      (`preemption.reference.plan_preemption_exhaustive`), the reference the bounded planner is
      checked against; for tests and small pools only.
    """

    overcommit: OvercommitPolicy = field(default_factory=OvercommitPolicy)
    min_runtime_s: float = 600.0
    min_runtime_by_level: tuple[tuple[str, float], ...] = (("P0", 0.0),)
    starvation_wait_s: float = 1800.0
    reclaim_backoff_s: float = 1800.0
    lend_after_s: float = 1800.0
    lend_forecast_s: float | None = 7200.0
    checkpoint_interval_s: float | None = None
    preemption: bool = True
    scorer: NodeScorer = field(default_factory=default_scorer)
    node_priority_seed: int | None = None
    gpu_model_order: GpuModelOrder = field(default_factory=GpuModelOrder)
    plan_steps_per_request: int = 1_024
    plan_steps_per_cycle: int = 200_000
    elastic_grow_idle_s: float | None = 600.0
    exhaustive_preemption: bool = False

    def __post_init__(self) -> None:
        if self.lend_after_s < 0 or self.reclaim_backoff_s < 0:
            raise ValueError(
                f"lend_after_s and reclaim_backoff_s must be >= 0 seconds, got {self.lend_after_s}, "
                f"{self.reclaim_backoff_s}"
            )
        if self.lend_forecast_s is not None and self.lend_forecast_s <= 0:
            raise ValueError(f"lend_forecast_s must be > 0 seconds or None, got {self.lend_forecast_s}")
        if self.checkpoint_interval_s is not None and self.checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint interval must be > 0 seconds, got {self.checkpoint_interval_s}")
        if self.plan_steps_per_request < 1 or self.plan_steps_per_cycle < 1:
            raise ValueError(
                "plan_steps_per_request and plan_steps_per_cycle must be >= 1 step, got "
                f"{self.plan_steps_per_request}, {self.plan_steps_per_cycle}"
            )
        if self.elastic_grow_idle_s is not None and self.elastic_grow_idle_s < 0:
            raise ValueError(f"elastic_grow_idle_s must be >= 0 seconds or None, got {self.elastic_grow_idle_s}")
        levels = {rules.level for rules in TIERS_IN_ORDER}
        for level, seconds in self.min_runtime_by_level:
            if level not in levels:
                raise ValueError(f"minimum runtime for unknown tier level {level!r}; use one of {sorted(levels)}")
            if seconds < 0:
                raise ValueError(f"minimum runtime for {level} must be >= 0 seconds, got {seconds}")

    def history_s(self) -> float:
        """How far back a lender's idle history is read (the longest span a lending rule reads)."""
        forecast = self.lend_forecast_s if self.checkpoint_interval_s is not None else None
        return max(self.lend_after_s, forecast or 0.0)

    def min_runtime_for(self, rules: TierRules) -> float:
        """How old an allocation must be before a request of the tier with `rules` may preempt it."""
        return dict(self.min_runtime_by_level).get(rules.level, self.min_runtime_s)

    def min_runtimes(self) -> tuple[float, ...]:
        """Every minimum runtime some tier applies, ascending (when a running allocation turns preemptible)."""
        return tuple(sorted({self.min_runtime_for(rules) for rules in TIERS_IN_ORDER}))

    def borrow_backoff_s(self, reclaims: int) -> float:
        """How long after its last reclaim a request reclaimed `reclaims` times waits to borrow again."""
        return self.reclaim_backoff_s * 2 ** max(0, reclaims - 1) if reclaims else 0.0

    def fitted(self, pending: Sequence[Request], running: Iterable[Request]) -> SchedulerConfig:
        """This config for one cycle: a scorer that learns its workload (`CycleFittedXirang`) fitted to
        the cycle's `pending` and `running` requests; any other scorer unchanged."""
        if not isinstance(self.scorer, CycleFittedXirang):
            return self
        return replace(self, scorer=self.scorer.for_requests([*pending, *running]))

    def node_priority(self, node_count: int) -> np.ndarray:
        """Rank of each node in tie-breaks (lower wins); read-only."""
        return _node_priority(self.node_priority_seed, node_count)


@lru_cache(maxsize=16)
def _node_priority(seed: int | None, node_count: int) -> np.ndarray:
    if seed is None:
        order = np.arange(node_count, dtype=np.int64)
    else:
        order = np.random.default_rng(seed).permutation(node_count).astype(np.int64)
    order.setflags(write=False)
    return order


DEFAULT_CONFIG = SchedulerConfig()
