"""The scheduling tick's pure step: gated runs + ledger allocations + pool -> the cycle's plan.

No Dagster and no database here: the sensor (`scheduling_tick.py`) reads the world, calls `plan_tick`,
and writes what it returns. The decision itself is the simulator's: the same `cycle` on a snapshot
of the pool, the allocations the ledger holds and the runs waiting behind the gate. `plan_tick` adds
what only the live platform needs: parsing each run's tags back into a request (a run whose tags no
longer parse, or that can never be placed, fails instead of waiting forever) and a hold reason
written for people ("quota: tenant research at its cap, 48 of 48 GPUs held, 8 asked (...)"); the run's
place in the queue and its estimated start are the queue view's (`sensors/queue_tags.py`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from xirang_platform.control import run_tags as rt
from xirang_platform.control import tag_parsing
from xirang_platform.control.platform_config import PlatformConfig
from xirang_platform.pool.model import MILLI_PER_GPU, Pool
from xirang_platform.scheduling import quota
from xirang_platform.scheduling.cycle import cycle
from xirang_platform.scheduling.cycle_memo import CycleMemo
from xirang_platform.scheduling.holds import no_fit_message
from xirang_platform.scheduling.lending import idle_views
from xirang_platform.scheduling.model import Allocation, Hold, HoldReason, Request
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot

_logger = logging.getLogger("xirang.tick")

# Holds that no later tick can lift: the run fails with the message instead of waiting forever.
FAILING_HOLDS = (HoldReason.NEVER_FITS, HoldReason.EXCEEDS_CAP, HoldReason.UNKNOWN_ACCOUNT)
_CAUSE_END = re.compile(r", | \(|; ")


@dataclass(frozen=True)
class GatedRun:
    """A queued run behind the closed gate: its id, tags and code location."""

    run_id: str
    tags: Mapping[str, str]
    location: str | None


@dataclass(frozen=True)
class TickPlan:
    """What one tick decided: the cycle's result, runs to fail (with why), and every held run's
    hold reason text. `snapshot` is what the cycle decided on."""

    snapshot: Snapshot
    requests: tuple[Request, ...]
    result: CycleResult
    failures: dict[str, str] = field(default_factory=dict)
    hold_texts: dict[str, str] = field(default_factory=dict)

    @property
    def allocated_fraction(self) -> float:
        """The pool's allocated share before the cycle (the ledger's cap ratio is read at it)."""
        return self.snapshot.state.allocated_fraction

    def allocations_after(self) -> list[Allocation]:
        """The live allocations once the plan is carried out: the snapshot's less the victims, at their
        new size where resized, plus the admissions."""
        return _allocations_after(self.snapshot, self.result)

    def balances_after(self) -> quota.Balances:
        """The accounts' balances once the plan is carried out."""
        return _balances_after(self.snapshot, self.result)

    def fraction_after(self) -> float:
        """The pool's allocated share once the plan is carried out (the cap ratio is read at it)."""
        return _fraction_after(self.snapshot, self.result)


def parse_gated(runs: Sequence[GatedRun], platform: PlatformConfig) -> tuple[list[Request], dict[str, str]]:
    """The requests of the gated runs, and the runs whose tags no longer parse (with the message):
    one run's tags fail that run alone, never the tick (DESIGN.md section 7)."""
    requests: list[Request] = []
    failures: dict[str, str] = {}
    for run in runs:
        tenant = platform.tenant_for(run.location)
        projects = platform.projects_of(tenant) if tenant is not None else None
        try:
            parsed = tag_parsing.parse(run.tags, tenant, run_id=run.run_id, projects=projects)
        except Exception as e:  # a parser bug: this run fails with it, the other runs are still planned
            _logger.exception("could not read the tags of run %s", run.run_id)
            parsed = rt.TagProblem("tags", None, f"the platform could not read this run's tags ({e!r}): report it")
        if isinstance(parsed, rt.TagProblem):
            failures[run.run_id] = parsed.message
        elif parsed is not None:
            # The last tick's budget did not reach it: it keeps its place (DESIGN.md 5.6).
            requests.append(replace(parsed, deferred=True) if was_deferred(run.tags) else parsed)
    return requests, failures


def plan_tick(
    pool: Pool,
    book: quota.QuotaBook,
    allocations: Sequence[Allocation],
    runs: Sequence[GatedRun],
    now: float,
    platform: PlatformConfig,
    memo: CycleMemo | None = None,
    idle: quota.IdleHistory | None = None,
    out_of_time: Callable[[], bool] | None = None,
    lasting_free: int | None = None,
) -> TickPlan:
    """Run the scheduler's `cycle` over the gated runs and describe every hold for people. `memo`: the
    previous tick's `result.memo` (the cycle decides the same with it, faster); `idle` (the ledger's
    `Ledger.idle_history`) gives the snapshot the quota idle for `lend_after_s` up to `now`, and the
    lending forecast (`lending.idle_views`); `out_of_time`: the tick's wall-clock guard (runs the
    cycle does not reach by then wait `deferred`, first in their tier next tick); `lasting_free`: the
    pool's milli free for `elastic_grow_idle_s` up to `now` (`Ledger.lasting_free`), what elastic
    runs may grow into (None: none grows)."""
    requests, failures = parse_gated(runs, platform)
    lasting, forecast = idle_views(idle, platform.scheduler, allocations, now)
    allocations = [settled(a) for a in allocations]
    snapshot = replace(
        Snapshot.build(pool, allocations, book), lasting_idle=lasting, idle_ahead=forecast, lasting_free=lasting_free
    )
    result = cycle(snapshot, requests, now, platform.scheduler, memo, out_of_time)
    by_id = {r.id: r for r in requests}
    texts: dict[str, str] = {}
    after = _balances_after(snapshot, result)
    ratio = platform.scheduler.overcommit.ratio(_fraction_after(snapshot, result))
    for hold in result.holds:
        request = by_id[hold.request_id]
        if hold.reason in FAILING_HOLDS:
            failures[hold.request_id] = f"{hold.reason.value}: {hold.message}"
            continue
        texts[hold.request_id] = hold_text(hold, request, book, after, ratio)
    return TickPlan(snapshot, tuple(requests), result, failures, texts)


def settled(a: Allocation) -> Allocation:
    """`a` as the cycle may resize it: an elastic run only once its launch is confirmed. Until then (an
    admission not yet started, a resized run stopping on its notice, its resumption not yet started)
    it is offered as a fixed request, so the cycle neither grows nor shrinks a run in transition (a
    resize of it would restart a run that has not run yet); it may still be preempted whole."""
    if a.confirmed or a.request.elastic is None:
        return a
    return replace(a, request=replace(a.request, elastic=None))


def hold_text(
    hold: Hold,
    request: Request,
    book: quota.QuotaBook,
    balances: Mapping[quota.AccountKey, quota.Balance],
    ratio: float,
) -> str:
    """Why a run waits, in one line for the UI: its kind (`run_tags.HOLD_KINDS`, the gate's value),
    then the numbers. Its place in the queue is a tag of its own (`xirang/position`)."""
    if hold.reason is HoldReason.OVER_QUOTA:
        if request.tier.may_borrow:  # held by its reclaim back-off: the cycle's message says until when
            return f"quota: {hold.message}"
        binding = quota.check(book, balances, request, ratio)  # the cycle's rule, on the balances after it
        if binding.verdict is quota.Verdict.OVER_QUOTA and binding.account is not None:
            key, b = binding.account, balances[binding.account]
            kind = "tenant" if key.project is None else "project"
            return (
                f"quota: {kind} {key} at its cap, {_gpus(b.in_quota)} of {_gpus(quota.cap(b.quota, ratio))} GPUs "
                f"held, {_gpus(request.total_milli)} asked ({request.tier.value} may not borrow)"
            )
        return f"quota: {hold.message}"
    if hold.reason is HoldReason.RESERVED_FOR_GANG:  # the cycle's message names the gang that binds this run
        return f"reserved: {hold.message}"
    if hold.reason is HoldReason.ALREADY_RUNNING:
        return f"duplicate: {hold.message}"
    if hold.reason is HoldReason.DEFERRED:  # the cycle's message restates the request: the UI has it
        return f"{DEFERRED_CAUSE}: the tick's budget ran out before its turn; it goes first in its tier next tick"
    ask = f"capacity: no room for {describe_ask(request)} now"
    # the cycle's own no-fit message restates the request (its id, tier, GPUs): the UI has them already
    return ask if hold.message == no_fit_message(request, None) else f"{ask} ({hold.message})"


DEFERRED_CAUSE = "deferred"  # a hold text's cause when the tick's budget did not reach the run


def was_deferred(tags: Mapping[str, str]) -> bool:
    """Whether the last tick held this run `deferred` (its hold reason tag says so): the platform
    writes that tag alone, so a user cannot jump the queue with it."""
    return tags.get(rt.HOLD_REASON, "").startswith(f"{DEFERRED_CAUSE}: ")


def hold_cause(text: str) -> str:
    """What a hold text says is in the way, without its numbers: the part before the first `, `,
    ` (` or `; ` (`quota: tenant research at its cap`, `capacity: no room for 2 GPUs now`). A run's
    log gets a new `held:` event when this changes, not when a balance moves."""
    return _CAUSE_END.split(text, maxsplit=1)[0]


def describe_ask(request: Request) -> str:
    """`2 GPUs`, `1 GPU`, `2 to 8 GPUs` (an elastic range, steps of 2 when it has them) or `250 milli
    of one GPU`, plus the model or memory constraint if any."""
    if request.elastic is not None:
        step = f" in steps of {request.elastic.step}" if request.elastic.step != 1 else ""
        ask = f"{request.elastic.min} to {request.elastic.max} GPUs{step}"
    elif request.whole_gpus:
        ask = f"{request.gpus} GPU" + ("s" if request.gpus != 1 else "")
    else:
        ask = f"{request.milli_per_gpu} milli of one GPU"
    if request.gpu_models:
        ask += f" of {'|'.join(sorted(request.gpu_models))}"
    if request.gpu_memory_mib:
        ask += f" with {request.gpu_memory_mib / 1024:g} GB each"
    return ask


def _gpus(milli: int) -> str:
    return f"{milli / MILLI_PER_GPU:g}"


def _allocations_after(snapshot: Snapshot, result: CycleResult) -> list[Allocation]:
    victims = {p.victim.id for p in result.preempts}
    resized = {r.request_id: r.new for r in result.resizes}
    held = [resized.get(a.id, a) for a in snapshot.allocations.values() if a.id not in victims]
    return [*held, *(ad.allocation for ad in result.admits)]


def _balances_after(snapshot: Snapshot, result: CycleResult) -> quota.Balances:
    return quota.balances_from(snapshot.book, _allocations_after(snapshot, result))


def _fraction_after(snapshot: Snapshot, result: CycleResult) -> float:
    capacity = snapshot.state.capacity_milli
    if not capacity:
        return 0.0
    freed = sum(p.victim.milli for p in result.preempts) + sum(r.old.milli for r in result.resizes)
    taken = sum(ad.allocation.milli for ad in result.admits) + sum(r.new.milli for r in result.resizes)
    return min(1.0, max(0.0, (snapshot.state.allocated_milli + taken - freed) / capacity))
