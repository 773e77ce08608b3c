"""What one cycle remembers so as not to decide the same thing twice (`CycleCache`), apart from the
rules it decides by (`cycle._CycleRun`).

Every answer here is a pure function of facts the cache is told about when they change, so the cycle
decides the same with it as without it (the memo-against-no-memo property tests hold it to that):

- **classes**: requests of one shape, tenant, project and borrow back-off meet the same hold
  (`remember`, `answer`) until an admission or preemption moves their tenant's balances
  (`tenant_moved`), or capacity grows, the cap ratio moves, the gang reservation changes or the
  lending pass opens (`new_epoch`);
- **holds**: the hold a request met last cycle is re-used, message and all, while its reason and
  token are the same (`hold`, `answer`);
- **misses**: a placement that found no room stays a miss until capacity grows (`capacity_grew`:
  admissions only take capacity); the previous cycle's misses are checked on the nodes that gained
  capacity since (`cycle_memo.Growth`) before use;
- **facts of the pool**: whether a shape could fit the empty pool at all (`never_fits`), and which
  shapes fit now (`fits_anywhere`, forgotten on every admission).

The cache starts from the previous cycle's `cycle_memo.CycleMemo`, where one is given, and hands its
share of the next memo back (`misses_to_carry`, `kept_holds`, `class_numbers`, `never_fits_seen`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from xirang_platform.pool.model import MILLI_PER_GPU
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.cycle_memo import CycleMemo, Growth, PlaceKey
from xirang_platform.scheduling.holds import HoldOutcome, KeptHold
from xirang_platform.scheduling.model import Hold, HoldReason, Placement, Request
from xirang_platform.scheduling.placement import fits, place
from xirang_platform.scheduling.state import ClusterState

# The outcome a class meets when its request would borrow: it waits for the lending pass.
AWAITS_LENDING = HoldOutcome(HoldReason.OVER_QUOTA, "awaits lending", None)
_MOST_CLASSES = 50_000  # classes a memo numbers before they are numbered afresh (keys with times grow)


class _ClassAnswer(NamedTuple):
    """The hold a class met, at which epoch and version of its tenant's balances."""

    epoch: int
    version: int
    outcome: HoldOutcome


class CycleCache:
    """The answers one cycle re-uses: per class of requests, per request, per placement and per shape.

    `state` is the cycle's working state (placements are looked up on it as it changes), placed with
    `config`'s scorer and the node `priority`."""

    __slots__ = (
        "_accounts_hold",
        "_capacity_state",
        "_carried_no_fit",
        "_config",
        "_fits_anywhere",
        "_grown",
        "_last_holds",
        "_no_fit",
        "_no_plan",
        "_outcomes",
        "_priority",
        "_state",
        "_token",
        "_versions",
        "epoch",
        "class_numbers",
        "kept_holds",
        "never_fits_seen",
        "placements",
    )

    def __init__(self, memo: CycleMemo | None, state: ClusterState, config: SchedulerConfig, priority: np.ndarray):
        self._state, self._config, self._priority = state, config, priority
        self.epoch = 0  # bumped when capacity grows, the cap ratio moves or the gang reservation changes
        self.placements = 0  # placements tried on the pool (`result.CycleWork`)
        self._versions: dict[str, int] = {}  # per tenant: bumped when its balances move
        self._outcomes: dict[int, _ClassAnswer] = {}  # per class number
        self.class_numbers: dict[tuple, int] = {}
        self._accounts_hold: set[int] = set()  # classes whose account exists and caps could hold them
        self._last_holds: Mapping[str, KeptHold] = {}  # the previous cycle's, per request id
        self.kept_holds: dict[str, KeptHold] = {}  # this cycle's, per request id
        # Placements that found no room since capacity last grew, with a request of their shape; the
        # previous cycle's are checked on the nodes that gained capacity since (`_grown`) before use.
        self._no_fit: dict[PlaceKey, Request] = {}
        self._carried_no_fit: Mapping[PlaceKey, Request] = {}
        self._grown: Growth | None = None
        self._no_plan: set[tuple] = set()  # preemption keys that found no plan since capacity last grew
        self._fits_anywhere: set[tuple] = set()  # shapes that fit now; forgotten on every admission
        self.never_fits_seen: dict[tuple, bool] = {}  # per shape: whether it fits nowhere on the empty pool
        self._capacity_state: ClusterState | None = None
        self._token: tuple[np.ndarray, bytes] | None = None
        if memo is not None:
            self.never_fits_seen = dict(memo.never_fits)
            if len(memo.classes) <= _MOST_CLASSES:  # else numbered afresh (the holds name the old numbers)
                self._last_holds = memo.holds
                self.class_numbers = dict(memo.classes)
            if memo.state.gpu_free.shape == state.gpu_free.shape:
                self._carried_no_fit = memo.no_fit
                self._grown = Growth(memo.state, state)

    # -- classes and their holds ------------------------------------------------------------------

    def class_of(self, request: Request) -> int:
        """The number of `request`'s class: requests that meet the same answer in the same situation."""
        last = self._last_holds.get(request.id)
        return last.class_no if last is not None and last.request is request else self._number(request)

    def answer(self, request: Request, afresh: frozenset[str]) -> tuple[int, HoldOutcome | None, Hold | None]:
        """`request`'s class; the hold that class met, if nothing it depends on moved since (None:
        decide it afresh, as always for a request of `afresh`); and that hold made for `request`
        (None for `AWAITS_LENDING`), its message built only when last cycle's hold does not serve.

        One call per request with everything inline: the loop most of a steady tick is spent in
        (`bench/cycle_speed.py` `tick`: split into `class_of`, an outcome lookup and `hold`, it made
        28% more Python calls per tick)."""
        rid = request.id
        last = self._last_holds.get(rid)
        if last is not None and last.request is request:
            class_no = last.class_no
        else:
            last, class_no = None, self._number(request)
        known = self._outcomes.get(class_no)
        if (
            known is None
            or known.epoch != self.epoch
            or known.version != self._versions.get(request.tenant, 0)
            or rid in afresh
        ):
            return class_no, None, None
        outcome = known.outcome
        if outcome is AWAITS_LENDING:
            return class_no, outcome, None
        if last is not None and last.hold.reason is outcome.reason and last.token == outcome.token:
            self.kept_holds[rid] = last  # the same hold as last cycle: its message is not built again
            return class_no, outcome, last.hold
        hold = outcome.hold(request)
        self.kept_holds[rid] = KeptHold(request, hold, outcome.token, class_no)
        return class_no, outcome, hold

    def _number(self, request: Request) -> int:
        key = (request.shape, request.tenant, request.project, request.reclaimed_at, request.reclaims)
        number = self.class_numbers.get(key)
        if number is None:
            number = self.class_numbers[key] = len(self.class_numbers)
        return number

    def remember(self, class_no: int, tenant: str, outcome: HoldOutcome) -> None:
        """class `class_no` met `outcome` now: the rest of it meets the same until its tenant or the epoch moves."""
        self._outcomes[class_no] = _ClassAnswer(self.epoch, self._versions.get(tenant, 0), outcome)

    def hold(self, request: Request, outcome: HoldOutcome, class_no: int) -> Hold:
        """`request`'s hold for `outcome`: its last cycle's when that had the same reason and token (its
        message is not built again), else a new one."""
        last = self._last_holds.get(request.id)
        if last is not None and last.fits(request, outcome.reason, outcome.token):
            self.kept_holds[request.id] = last
            return last.hold
        hold = outcome.hold(request)
        self.kept_holds[request.id] = KeptHold(request, hold, outcome.token, class_no)
        return hold

    def account_holds(self, class_no: int) -> bool:
        """Whether class `class_no`'s account was found to exist with caps that could ever hold it (the same
        answer for the whole class: tenant, project and shape decide it)."""
        return class_no in self._accounts_hold

    def account_held(self, class_no: int) -> None:
        self._accounts_hold.add(class_no)

    def new_epoch(self) -> None:
        """The cap ratio moved, the gang reservation changed or the lending pass opened: no class's
        hold stands any more."""
        self.epoch += 1

    def tenant_moved(self, tenant: str) -> None:
        """`tenant`'s balances moved: the holds its classes met no longer stand."""
        self._versions[tenant] = self._versions.get(tenant, 0) + 1

    # -- placements --------------------------------------------------------------------------------

    def place(self, request: Request, allowed: np.ndarray | None, limit: int | None) -> Placement | None:
        """Where `request` fits now on `allowed` nodes, holding at most `limit` milli (None: any)."""
        if limit is not None:
            if limit < request.total_milli:
                return None
            if limit >= request.gpus * MILLI_PER_GPU:
                limit = None  # no rounding can take it past the limit
        key = (request.shape, self.allowed_token(allowed), limit)
        if key in self._no_fit or (self._carried_no_fit and self._still_no_fit(key, allowed, limit)):
            return None
        self.placements += 1
        found = place(self._state, request, self._config.scorer, self._priority, allowed, limit)
        if found is None:
            self._no_fit[key] = request
        return found

    def fits_anywhere(self, request: Request) -> bool:
        """Whether `request` fits now on any node, the gang reservation ignored."""
        shape = request.shape
        if shape in self._fits_anywhere:
            return True
        key = (shape, None, None)  # as `place` with every node and no limit
        if key in self._no_fit or self._still_no_fit(key, None, None):
            return False
        self.placements += 1
        if fits(self._state, request, self._priority):
            self._fits_anywhere.add(shape)
            return True
        self._no_fit[key] = request
        return False

    def never_fits(self, request: Request) -> bool:
        """Whether no node or domain of the pool could hold the request even with nothing running."""
        shape = request.shape
        if shape not in self.never_fits_seen:
            if self._capacity_state is None:
                self._capacity_state = self._state.empty_like()
            # Whether it fits, not where: on an empty pool no node needs scoring to answer that.
            self.never_fits_seen[shape] = not fits(self._capacity_state, request, self._priority)
        return self.never_fits_seen[shape]

    def no_plan(self, key: tuple) -> bool:
        """Whether a preemption for `key` found no plan since capacity last grew."""
        return key in self._no_plan

    def found_no_plan(self, key: tuple) -> None:
        self._no_plan.add(key)

    def capacity_taken(self) -> None:
        """An admission took capacity: the shapes known to fit may not any more."""
        self._fits_anywhere.clear()

    def capacity_grew(self) -> None:
        """A preemption freed capacity: earlier misses may fit now, and no class's hold stands."""
        self._no_fit.clear()
        self._carried_no_fit = {}
        self._no_plan.clear()
        self._fits_anywhere.clear()
        self.epoch += 1

    def misses_to_carry(self) -> Mapping[PlaceKey, Request]:
        """The misses that stand at the cycle's end, for the next cycle's memo."""
        # Nothing grew since the memo's end and nothing was preempted: every carried miss still stands.
        if self._carried_no_fit and self._grown is not None and self._grown.none:
            return {**self._carried_no_fit, **self._no_fit}
        return self._no_fit

    def _still_no_fit(self, key: PlaceKey, allowed: np.ndarray | None, limit: int | None) -> bool:
        """Whether the previous cycle's miss `key` still stands (then it is a miss of this cycle too)."""
        carried = self._carried_no_fit.get(key)
        if carried is None or self._grown is None:
            return False
        if not self._grown.still_no_fit(self._state, carried, allowed, limit, self._config, self._priority):
            return False
        self._no_fit[key] = carried
        return True

    def allowed_token(self, allowed: np.ndarray | None) -> bytes | None:
        """A key for the nodes a placement may use: the same across cycles for the same nodes."""
        if allowed is None:
            return None
        if self._token is None or self._token[0] is not allowed:
            self._token = (allowed, allowed.tobytes())
        return self._token[1]
