"""The queue estimate scored on a replay (`xirang simulate --eta-every S`, DESIGN.md section 8).

Every `S` simulated seconds (at the first cycle at or after each multiple of `S`) the replay's observer
asks the queue view's estimator (`eta.estimate_starts`) for every waiting job's start, from the
replay's state after that cycle; a job's expected duration is its trace duration, declared as a user
would with `xirang/expected-duration`, so running work ends at its start plus it. Each estimate is
scored against the job's next admission in the same replay; a sample whose job never started is left
out (`never_started`). Beside it, two baselines on the same samples:

- `starts_now`: every waiting job starts now;
- `declared_ends`: the running work's expected ends without simulating the queue (the counting the
  queue view did before the forward simulation): the waiting jobs, in the cycle's order, take the idle
  GPUs and those the expected ends free, earliest first; a job starts once they cover its ask and the
  asks before it (never, unknown, when they do not).

`eta_metrics` gives `samples`, `unknown` (samples the forward estimate leaves unknown), its
`median_abs_error_s` and `p90_abs_error_s` over the samples it dates, and per baseline the same two
over the samples both it and the forward estimate date, with the forward estimate's own two on those
same samples (`forward`) and how many of the dated samples the baseline leaves unknown.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from xirang_platform.pool.model import Pool
from xirang_platform.scheduling.config import SchedulerConfig
from xirang_platform.scheduling.model import Allocation, Request
from xirang_platform.scheduling.order import queue_order
from xirang_platform.scheduling.quota import QuotaBook, balances_from
from xirang_platform.scheduling.result import CycleResult
from xirang_platform.scheduling.snapshot import Snapshot
from xirang_platform.simulate.eta import MAX_CYCLES, Forecast, estimate_starts

BASELINES = ("starts_now", "declared_ends")


@dataclass(frozen=True)
class EtaSample:
    """One waiting job's estimates at `t`: the forward simulation's and the baselines' (None: unknown)."""

    job: str
    t: float
    forward: float | None
    declared_ends: float | None

    @property
    def starts_now(self) -> float:
        """The `starts_now` baseline: now."""
        return self.t


class EtaSampler:
    """The replay's observer (`replay.Observer`): every `every_s` simulated seconds, each waiting job's
    estimates. `durations`: each job's trace duration; `config` and `tick_s`: the replay's own."""

    def __init__(
        self,
        pool: Pool,
        book: QuotaBook,
        config: SchedulerConfig,
        durations: Mapping[str, float],
        every_s: float,
        *,
        tick_s: float = 0.0,
        max_cycles: int = MAX_CYCLES,
    ) -> None:
        if not (every_s > 0 and math.isfinite(every_s)):
            raise ValueError(f"the estimate's sampling interval must be > 0 seconds, got {every_s}")
        self.pool, self.book, self.config, self.durations = pool, book, config, durations
        self.every_s, self.tick_s, self.max_cycles = every_s, tick_s, max_cycles
        self.next_at: float | None = None
        self.samples: list[EtaSample] = []
        self.horizons = 0  # estimates the cycle bound cut short

    def __call__(
        self, now: float, result: CycleResult, pending: Mapping[str, Request], allocations: Mapping[str, Allocation]
    ) -> None:
        if self.next_at is not None and now < self.next_at:
            return
        self.next_at = (math.floor(now / self.every_s) + 1) * self.every_s
        if pending:
            self._sample(now, pending, allocations)

    def _sample(self, now: float, pending: Mapping[str, Request], allocations: Mapping[str, Allocation]) -> None:
        snapshot = Snapshot.build(self.pool, allocations.values(), self.book)
        balances = balances_from(self.book, allocations.values())
        order = list(queue_order(list(pending.values()), self.book, balances))
        ends = {a.id: a.start + self.durations[a.id] for a in allocations.values()}
        forecast = Forecast(ends, {r.id: self.durations[r.id] for r in order})
        got = estimate_starts(
            snapshot, order, now, self.config, forecast, max_cycles=self.max_cycles, tick_s=self.tick_s
        )
        self.horizons += got.horizon
        idle = snapshot.state.capacity_milli - snapshot.state.allocated_milli
        counted = declared_ends(order, [(a, ends[a.id]) for a in allocations.values()], idle, now)
        for r, by_ends in zip(order, counted, strict=True):
            self.samples.append(EtaSample(r.id, now, got.starts[r.id], by_ends))


def declared_ends(
    order: Sequence[Request], running: Sequence[tuple[Allocation, float | None]], idle_milli: int, now: float
) -> list[float | None]:
    """The `declared_ends` baseline for the requests of `order` (the cycle's order): when the idle
    milli plus those freed by the known ends, earliest first, cover each request's ask and the asks
    before it (None: never)."""
    known = sorted(((t, a.id, a.milli) for a, t in running if t is not None))
    free, i, ahead = idle_milli, 0, 0
    out: list[float | None] = []
    for r in order:
        ahead += r.total_milli
        while free < ahead and i < len(known):
            free += known[i][2]
            i += 1
        out.append(None if free < ahead else (now if i == 0 else max(now, known[i - 1][0])))
    return out


def eta_metrics(samples: Sequence[EtaSample], events: Sequence[Mapping], every_s: float) -> dict:
    """The `eta` figures of a replay's `samples` against its `events`' admissions (module docstring)."""
    admits: dict[str, list[float]] = {}
    for e in events:
        if e["event"] == "admit":
            admits.setdefault(e["job"], []).append(e["t"])
    scored: list[tuple[EtaSample, float]] = []
    for s in samples:
        actual = next((t for t in admits.get(s.job, []) if t >= s.t), None)
        if actual is not None:
            scored.append((s, actual))
    dated = [(s, actual) for s, actual in scored if s.forward is not None]
    out: dict = {
        "every_s": every_s,
        "samples": len(scored),
        "never_started": len(samples) - len(scored),
        "unknown": len(scored) - len(dated),
        **_errors([abs(s.forward - actual) for s, actual in dated if s.forward is not None]),
    }
    for name in BASELINES:
        both = [(s, getattr(s, name), actual) for s, actual in dated if getattr(s, name) is not None]
        out[name] = {
            **_errors([abs(e - actual) for _, e, actual in both]),
            "unknown": len(dated) - len(both),
            # the forward estimate on the very samples this baseline dates
            "forward": _errors([abs(s.forward - actual) for s, _, actual in both if s.forward is not None]),
        }
    return out


def _errors(errors: Sequence[float]) -> dict:
    """Median and 90th percentile of absolute errors, in seconds (None without samples)."""
    return {
        "median_abs_error_s": round(statistics.median(errors), 1) if errors else None,
        "p90_abs_error_s": round(_p90(errors), 1) if errors else None,
    }


def _p90(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
