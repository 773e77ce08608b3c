"""What one cycle returns: its decisions, and the memo it leaves for the next cycle (DESIGN.md section 5).

Apart from the decision types (`model`) because the memo is the cycle's top-level cache
(`cycle_memo.CycleMemo`): the value types stay below every module that computes with them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xirang_platform.scheduling.model import Admit, Allocation, Hold, Preempt, Resize, Return

if TYPE_CHECKING:
    from xirang_platform.scheduling.cycle_memo import CycleMemo


@dataclass(frozen=True)
class CycleWork:
    """What one cycle spent, against the bounds DESIGN.md 5.2 asks every search to state (the tests
    of `tests/scheduling/test_cycle_bounds.py` hold a worst case of each to it):

    - `plan_steps`: the preemption planner's steps, at most `plan_steps_per_cycle` plus what the last
      request it started may spend (`preemption.scope_search.Steps`);
    - `placements`: placements tried on the whole pool (each one pass over it at most), at most
      `PLACEMENTS_PER_TURN` per turn a request gets;
    - `reservation_moves`: changes of the gang reservation, at most `holds.MOST_RESERVATION_MOVES` past its first;
    - `turns`: requests considered, at most the queue once per hold (the first, and after each move
      the requests that hold kept out), so `(MOST_RESERVATION_MOVES + 2) x` the queue with the lending pass;
    - `elastic_placements`: placements the elastic rules tried (`elastic`'s bounds: a bisection
      over the sizes of each elastic admission and running run, and shrink plans within the steps).
    """

    plan_steps: int = 0
    placements: int = 0
    reservation_moves: int = 0
    turns: int = 0
    elastic_placements: int = 0


PLACEMENTS_PER_TURN = 4  # placed within the headroom, borrowing, past the cap once rounded; or fits anywhere


@dataclass(frozen=True)
class CycleResult:
    """Everything one cycle decided, in the order it decided it."""

    admits: tuple[Admit, ...] = ()
    preempts: tuple[Preempt, ...] = ()
    holds: tuple[Hold, ...] = ()
    returns: tuple[Return, ...] = ()
    resizes: tuple[Resize, ...] = ()  # elastic runs grown or shrunk (DESIGN.md section 11)
    reserved_for: str | None = None  # the starving gang that units are held back for, if any
    work: CycleWork = field(default_factory=CycleWork, compare=False)  # what the cycle spent, against its bounds
    # What the cycle leaves for the next one (`cycle_memo.CycleMemo`): pass it back as `cycle(..., memo=)`.
    memo: CycleMemo | None = field(default=None, compare=False, repr=False)

    def admitted(self, request_id: str) -> Allocation | None:
        """The allocation admitted for `request_id` in this cycle, or None."""
        for a in self.admits:
            if a.request_id == request_id:
                return a.allocation
        return None
