"""What one cycle returns: its decisions, and the memo it leaves for the next cycle (DESIGN.md section 5).

Apart from the decision types (`model`) because the memo is the cycle's top-level cache
(`cycle_memo.CycleMemo`): the value types stay below every module that computes with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xirang_platform.scheduling.model import Admit, Allocation, Hold, Preempt, Return

if TYPE_CHECKING:
    from xirang_platform.scheduling.cycle_memo import CycleMemo


@dataclass(frozen=True)
class CycleResult:
    """Everything one cycle decided, in the order it decided it."""

    admits: tuple[Admit, ...] = ()
    preempts: tuple[Preempt, ...] = ()
    holds: tuple[Hold, ...] = ()
    returns: tuple[Return, ...] = ()
    reserved_for: str | None = None  # the starving gang that units are held back for, if any
    plan_steps: int = field(default=0, compare=False)  # the preemption planner's steps (`SchedulerConfig.plan_steps_*`)
    # What the cycle leaves for the next one (`cycle_memo.CycleMemo`): pass it back as `cycle(..., memo=)`.
    memo: CycleMemo | None = field(default=None, compare=False, repr=False)

    def admitted(self, request_id: str) -> Allocation | None:
        """The allocation admitted for `request_id` in this cycle, or None."""
        for a in self.admits:
            if a.request_id == request_id:
                return a.allocation
        return None
