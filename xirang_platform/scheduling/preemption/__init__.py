"""Preemption (DESIGN.md section 5.2): who may be a victim, what a plan costs, and the bounded
search for the cheapest plan.

The steps, for one request that does not fit (`cycle._CycleRun._try_preemption`):

1. `victims.CycleVictims`: the cycle's victims, listed once, cheapest first (`cost.victim_cost`),
   and per kind of request the ones it may take (`victim_reason`'s rule as a mask);
2. `planner.PreemptionPlanner`: the scopes where a plan may free room, cheapest lower bound first;
3. `scope_search.ScopeSearch`: in the first scope the greedy minimal set, then in each scope whose
   bound can still win a branch and bound, both within the budget of `scope_search.Steps`;
4. the cheapest set found is placed for real on the state it frees, within the cap it leaves.

`reference.plan_preemption_exhaustive` is the brute force the planner is checked against.

What each cache depends on, and the event that invalidates it:

| cache | kept in | invalidated by |
|---|---|---|
| the victim list, sorted | `CycleVictims.listed` | never within a cycle (victims only go: `active`) |
| a kind of request's victims | `CycleVictims.eligible` | never within a cycle (a mask, ANDed with `active`) |
| the pool with a mask's victims gone | `CycleVictims.potential` | kept in step: `taken` (admission), `gone` |
| per node, its cheapest victim | `CycleVictims.cheapest` | any preemption (`version`) |
| "no plan" per kind of request | `CycleCache.no_plan` | capacity growing; never set by a search the budget cut |
"""
