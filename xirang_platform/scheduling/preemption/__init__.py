"""Preemption (DESIGN.md section 5.2): who may be a victim, what a plan costs, and the bounded
search for the cheapest plan.

The steps, for one request that does not fit (`cycle._CycleRun._try_preemption`):

1. `victims.CycleVictims`: the cycle's victims, listed once, cheapest first (`cost.victim_cost`),
   and per kind of request the ones it may take (`victim_reason`'s rule as a mask);
2. `scopes.ScopeOrder`: the scopes where a plan may free room, cheapest lower bound first;
3. `scope_search.ScopeSearch`: in each scope whose bound can still win, the greedy minimal set, then
   a branch and bound, all within the budget of `scope_search.Steps` (`planner.PreemptionPlanner`
   drives them);
4. the cheapest set found, less any victim not needed in the pool, is placed for real on the state
   it frees, within the cap it leaves.

`reference.plan_preemption_exhaustive` is the brute force the planner is checked against.

What each cache depends on, and the event that invalidates it:

| cache | kept in | invalidated by |
|---|---|---|
| the victim list, sorted | `CycleVictims.listed` | never within a cycle (victims only go: `active`) |
| a kind of request's victims | `CycleVictims.eligible` | never within a cycle (a mask, ANDed with `active`) |
| a mask's pool without its victims, cheapest, milli | `victims.MaskView` | kept in step: `taken`, `gone` |
| a gang's group floors | `CycleVictims.gang_floors` | a change of the group's rows (stamps) |
| a scope's answer, or floor | `CycleVictims.scope_answers` | a change of the scope's rows (stamps) |
| own work's relief, its kinds | `CycleVictims.reliefs_for`, `relief_kinds` | never (`active` filters) |
| "no plan" per kind of request | `CycleCache.no_plan` | capacity growing; never set by a search the budget cut |
"""
