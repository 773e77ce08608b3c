"""The tick's ledger step: the cycle's decisions written in one transaction, and the cycle decided
again without any request the ledger refuses on its own account.

No Dagster here: the sensor (`sensors/scheduling_tick.py`) hands `reserve` the plan, the write and a
way to plan again over the same snapshot without some runs. A request the ledger refuses is left out
and the cycle decided again without it, at most `MAX_REFUSED_PER_TICK` times: a `BadRequest`'s run
fails with the reason, any other refusal (`OverCapacity`) waits with it, so one bad request never
fails the tick. Any other failure of the write leaves nothing written: no victim is stopped, no gate
opens, and the next tick decides again on a fresh snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Set
from dataclasses import replace
from typing import NamedTuple

from xirang_platform.control.tick_plan import TickPlan
from xirang_platform.ledger.errors import BadRequest, LedgerError, RequestRefused
from xirang_platform.ledger.ledger import Ledger
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.result import CycleResult

# Requests the ledger may refuse in one tick before the tick gives up writing (each costs a plan).
MAX_REFUSED_PER_TICK = 8
_logger = logging.getLogger("xirang.tick")


class Reserved(NamedTuple):
    """What the ledger step leaves: the plan as written (when nothing was, only its holds, refusals
    and failures), the last cycle's memo for the next tick, and why nothing was written (None: written)."""

    plan: TickPlan
    memo: CycleMemo | None
    stale: str | None


def write_ledger(ledger: Ledger, plan: TickPlan) -> str | None:
    """Apply the cycle's decisions to the ledger in one transaction (preemptions, resizes, the admissions
    reserved with their placements and charged the placed milli, then returns), each cap checked at
    the pool share the cycle saw when it decided (the pool's capacity lets the ledger follow the
    share as victims leave and admissions arrive) and each placement against the pool's capacity.
    All or nothing: when the ledger no longer matches the snapshot (another writer changed it), or
    the write fails in any other way, nothing is written and the reason is returned; the next tick
    decides again on a fresh snapshot. An admission the ledger refuses on its own account raises
    `RequestRefused` naming it (nothing written): decide again without it."""
    result = plan.result
    if not (result.admits or result.preempts or result.returns or result.resizes):
        return None
    try:
        ledger.apply_cycle(result, plan.allocated_fraction, pool=plan.snapshot.pool)
    except RequestRefused:
        raise
    except LedgerError as e:  # StaleCycle, LedgerBusy, a victim or return the ledger refuses
        _logger.warning("tick: the ledger refused the cycle (%s); deciding again next tick", e)
        return str(e)
    except Exception as e:  # noqa: BLE001 - no failure of the ledger write may end the tick: nothing was written
        _logger.exception("tick: the ledger write failed; nothing was written, deciding again next tick")
        return f"the ledger write failed ({type(e).__name__}: {e})"
    return None


def reserve(
    plan: TickPlan,
    write: Callable[[TickPlan], str | None],
    replan: Callable[[Set[str], CycleMemo | None], TickPlan],
    limit: int = MAX_REFUSED_PER_TICK,
) -> Reserved:
    """Write `plan` (`write`: `write_ledger` on the tick's ledger); while the write refuses one request
    (`RequestRefused`), plan again without every request refused so far (`replan`, given their ids and
    the last plan's memo) and write that, giving up after `limit` refusals. Returns what was written,
    with the refusals as failures or hold texts (`with_refusals`)."""
    refused: dict[str, RequestRefused] = {}
    while True:
        try:
            stale = write(plan)
            break
        except RequestRefused as e:
            _logger.warning("tick: %s; deciding again without it", e)
            refused[e.request_id] = e
        if len(refused) > limit:
            stale = f"the ledger refused {len(refused)} requests in one tick; the next tick decides again"
            break
        plan = replan(refused.keys(), plan.result.memo)
    memo = plan.result.memo  # checked against the next tick's snapshot, so kept even when nothing was written
    plan = with_refusals(plan, refused)
    if stale is not None:  # nothing was written: no victim is stopped, no gate opens
        plan = replace(plan, result=CycleResult(holds=plan.result.holds))
    return Reserved(plan, memo, stale)


def with_refusals(plan: TickPlan, refused: Mapping[str, RequestRefused]) -> TickPlan:
    """`plan` with the requests the ledger refused: a `BadRequest`'s run fails with the reason, any
    other waits with it as its hold reason (the next tick tries it again)."""
    if not refused:
        return plan
    failures = {rid: f"ledger: {e.reason}" for rid, e in refused.items() if isinstance(e, BadRequest)}
    held = {rid: f"ledger: {e.reason}" for rid, e in refused.items() if not isinstance(e, BadRequest)}
    return replace(plan, failures={**plan.failures, **failures}, hold_texts={**plan.hold_texts, **held})
